"""An example resumable training job: an MLP classifier on a synthetic data set.

    TRAINYARD_CHECKPOINT_DIR=/tmp/ckpt TRAINYARD_RESULTS_DIR=/tmp/results \\
        python -m runners.launch -- python -m runners.examples.classifier --seed 7

It generates its data from the seed (no downloads), trains deterministically, checkpoints
periodically and on SIGTERM/SIGUSR1, resumes from TRAINYARD_RESUME_FROM or the newest checkpoint,
reports metrics, and writes `result.json` (final loss and accuracy) and `model.pt` into the
results directory. Killed at any point and restarted, it ends with the same model and loss as a
run that was never interrupted.

What makes it resumable, and what a script of your own needs too:

* every piece of training state is either restored by the checkpointer (model, optimizer,
  scheduler, RNGs, step) or a pure function of the seed and the step (data set, batch order);
* the loop starts at the step `resume()` returns and calls `maybe_save(steps_done)` after each
  step, the only place where a checkpoint is taken;
* the loop runs inside `with checkpointer:`, which turns SIGTERM and SIGUSR1 into checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from runners import metrics
from runners.checkpoint import Checkpointer
from runners.config import RESULTS_DIR, ConfigError
from runners.durable import atomic_file, write_bytes_atomically

FEATURES = 16
CLASSES = 4
SAMPLES = 2048


def make_dataset(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian clusters around one random centre per class, overlapping enough to be hard."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLASSES, FEATURES, generator=generator) * 0.5
    labels = torch.randint(CLASSES, (SAMPLES,), generator=generator)
    inputs = centres[labels] + torch.randn(SAMPLES, FEATURES, generator=generator)
    return inputs, labels


def make_model() -> nn.Sequential:
    # Dropout draws from torch's global generator, so resuming is exact only if the checkpoint
    # restores that generator too.
    return nn.Sequential(
        nn.Linear(FEATURES, 64),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(64, CLASSES),
    )


def batch_indices(seed: int, step: int, batch_size: int) -> torch.Tensor:
    """The examples in `step`'s batch: a function of the seed and step alone, so a resumed run
    needs no data-loader state to see the same batches as an uninterrupted one."""
    batches_per_epoch = SAMPLES // batch_size
    epoch, position = divmod(step, batches_per_epoch)
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(seed + 1 + epoch))
    return order[position * batch_size : (position + 1) * batch_size]


def evaluate(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """Loss and accuracy on the whole data set, without dropout."""
    model.eval()
    with torch.no_grad():
        logits = model(inputs)
        loss = nn.functional.cross_entropy(logits, labels).item()
        accuracy = (logits.argmax(dim=1) == labels).float().mean().item()
    return loss, accuracy


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.examples.classifier")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where to train: cuda is the GPU the learner is given (CUDA_VISIBLE_DEVICES)",
    )
    args = parser.parse_args(argv)
    results_dir = os.environ.get(RESULTS_DIR)
    if not results_dir:
        parser.error(f"{RESULTS_DIR} must be set")

    # One thread: on the CPU the kernels are then deterministic, and the same seed gives
    # bit-identical runs, which is what lets a resumed run be compared with an uninterrupted one.
    torch.set_num_threads(1)
    if args.device == "cuda":
        # cuBLAS is deterministic only with a fixed workspace, set before CUDA starts; CUDA's
        # kernels need the switch (not set on the CPU: it imports torch's compiler settings,
        # 1.5 s of a learner's start on 2 cores).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    device = torch.device(args.device)
    inputs, labels = (tensor.to(device) for tensor in make_dataset(args.seed))
    model = make_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    try:
        checkpointer = Checkpointer.from_env(
            {"model": model, "optimizer": optimizer, "scheduler": scheduler}
        )
    except ConfigError as error:
        parser.error(str(error))
    start = checkpointer.resume()

    model.train()
    with checkpointer:
        for step in range(start, args.steps):
            batch = batch_indices(args.seed, step, args.batch_size).to(device)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
            torch.autograd.backward(loss)  # loss.backward(), in its type-annotated spelling
            optimizer.step()
            scheduler.step()
            done = step + 1
            if done % args.log_every == 0:
                metrics.log(step=done, loss=loss.item(), lr=scheduler.get_last_lr()[0])
            checkpointer.maybe_save(done)

    final_loss, accuracy = evaluate(model, inputs, labels)
    metrics.log(step=args.steps, final_loss=final_loss, accuracy=accuracy)
    _write_results(Path(results_dir), model, args.seed, args.steps, final_loss, accuracy)
    return 0


def _write_results(
    directory: Path, model: nn.Module, seed: int, steps: int, loss: float, accuracy: float
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_file(directory / "model.pt") as file:
        torch.save(model.state_dict(), file)
    result = {"seed": seed, "steps": steps, "final_loss": loss, "accuracy": accuracy}
    write_bytes_atomically(directory / "result.json", json.dumps(result, indent=2).encode())


if __name__ == "__main__":
    raise SystemExit(main())
