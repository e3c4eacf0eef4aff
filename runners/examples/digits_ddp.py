"""The digits classifier trained by several learners at once, in DistributedDataParallel.

    # alone (a world of one), or as each learner of a job (the agent sets RANK, WORLD_SIZE, ...)
    TRAINYARD_CHECKPOINT_DIR=/tmp/ckpt python -m runners.examples.digits_ddp --steps 200
    torchrun --nproc-per-node 2 -m runners.examples.digits_ddp --steps 200

The data split and the network are `runners.examples.digits`'s (its DEFAULTS), without dropout:
dropout masks drawn on each rank would make the ranks' sum differ from one learner's batch, and
the point of this example is that they do not. Every step takes a fixed global batch of
`--global-batch` images from one order of the training images, shuffled from (seed, epoch) alone;
rank r of W takes the r-th of W equal slices of it (the batch must divide evenly), and DDP
averages the ranks' gradients: a step is the same step one learner would take on the whole
batch, whatever the world size, up to float rounding. An epoch is the whole global batches the
training images fill (the remainder is left out, so that every batch divides).

Rank 0 saves a checkpoint every `--checkpoint-every` steps (and at the end) through
`runners.distributed`; every rank resumes from the one rank 0 picks. Rank 0 alone reports
metrics (the ranks' mean `loss`, and validation `accuracy`). At the end, rank 0 writes `--result`
(JSON: the final weights' sha256, whether every rank's weights have that digest, and the last
loss and accuracy) and, if asked, `--weights` (the state dict, for tests that compare runs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from runners import distributed, metrics
from runners.config import CHECKPOINT_DIR, ConfigError
from runners.durable import atomic_file, write_bytes_atomically
from runners.examples import digits
from runners.examples.digits import _epoch_seed


def global_order(seed: int, epoch: int, count: int) -> torch.Tensor:
    """The training images' order in `epoch`: the same on every rank, from (seed, epoch)."""
    # digits.py's own hash of (seed, epoch): one learner here shuffles as its epochs do.
    generator = torch.Generator().manual_seed(_epoch_seed(seed, epoch))
    return torch.randperm(count, generator=generator)


def local_batch(
    seed: int, step: int, count: int, global_batch: int, rank: int, world_size: int
) -> torch.Tensor:
    """The indices of the images rank `rank` trains on at `step` (0 first)."""
    per_epoch = count // global_batch
    epoch, position = divmod(step, per_epoch)
    share = global_batch // world_size
    first = position * global_batch + rank * share
    return global_order(seed, epoch, count)[first : first + share]


def digest(model: nn.Module) -> str:
    """sha256 of the weights' bytes, in the state dict's order: equal weights, equal digest."""
    hashed = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        hashed.update(name.encode())
        hashed.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return hashed.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.examples.digits_ddp")
    parser.add_argument("--seed", type=int, default=0, help="the data split, weights and batches")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=64, help="images a step, all ranks")
    parser.add_argument("--lr", type=float, default=digits.DEFAULTS["lr"])
    parser.add_argument("--checkpoint-every", type=int, default=50, metavar="STEPS")
    parser.add_argument("--log-every", type=int, default=10, metavar="STEPS")
    parser.add_argument("--result", type=Path, help="rank 0 writes the final digest here (JSON)")
    parser.add_argument("--weights", type=Path, help="rank 0 writes the final state dict here")
    parser.add_argument("--backend", choices=("nccl", "gloo"), help="default: by device")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if given a GPU")
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=0.0,
        help="a pause after each step, so that a test can kill a learner halfway through",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.global_batch < 1 or args.checkpoint_every < 1:
        parser.error("--steps, --global-batch and --checkpoint-every must be at least 1")

    # One thread: on the CPU this network's kernels are then deterministic, so a resumed run is
    # bit-identical to one never stopped.
    torch.set_num_threads(1)
    cuda = None if args.device is None else args.device == "cuda"
    if cuda is not False:
        # cuBLAS is deterministic only with a fixed workspace, set before CUDA starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        with distributed.process_group(backend=args.backend, cuda=cuda) as group:
            if group.device.type == "cuda":
                # CUDA's kernels need the switch. Not set on the CPU, where it is not needed:
                # it imports torch's compiler settings, 1.5 s of a learner's start on 2 cores.
                torch.use_deterministic_algorithms(True)
            return _train(parser, args, group)
    except ConfigError as error:
        parser.error(str(error))
    except distributed.RendezvousError as error:
        parser.exit(1, f"{parser.prog}: {error}\n")


def _train(
    parser: argparse.ArgumentParser, args: argparse.Namespace, group: distributed.Group
) -> int:
    if args.global_batch % group.world_size:
        parser.error(f"--global-batch {args.global_batch} does not divide over {group.world_size}")
    point = digits.parse(
        {**digits.DEFAULTS, "dropout": 0.0, "lr": args.lr, "batch_size": args.global_batch}
    )
    cpu = digits.load(args.seed)
    data = digits.Digits(
        cpu.train_inputs.to(group.device),
        cpu.train_labels.to(group.device),
        cpu.valid_inputs.to(group.device),
        cpu.valid_labels.to(group.device),
    )
    count = len(data.train_labels)
    if count < args.global_batch:
        parser.error(f"--global-batch {args.global_batch} is more than the {count} images")
    model = digits.build(point, args.seed).to(group.device)
    optimizer = digits.optimizer_for(model, point)
    checkpointer = None
    if os.environ.get(CHECKPOINT_DIR):
        checkpointer = distributed.ChiefCheckpointer.from_env(
            group, {"model": model, "optimizer": optimizer}, every=args.checkpoint_every
        )
    start = 0 if checkpointer is None else checkpointer.resume()
    if start > args.steps:
        parser.error(f"the checkpoint is of step {start}, past the {args.steps} steps to train")
    # After the restore: DDP starts every rank from rank 0's weights, which are the checkpoint's.
    ddp = DistributedDataParallel(model, device_ids=group.device_ids)

    accuracy = None
    # SIGTERM and SIGUSR1 to any rank become a checkpoint at the next step, on every rank.
    with checkpointer if checkpointer is not None else nullcontext():
        for step in range(start, args.steps):
            batch = local_batch(
                args.seed, step, count, args.global_batch, group.rank, group.world_size
            ).to(group.device)
            model.train()
            optimizer.zero_grad()
            inputs, labels = data.train_inputs[batch], data.train_labels[batch]
            loss = nn.functional.cross_entropy(ddp(inputs), labels)
            torch.autograd.backward(loss)  # loss.backward(), in its type-annotated spelling
            optimizer.step()
            done = step + 1
            if done % args.log_every == 0 or done == args.steps:
                mean = loss.detach().clone()
                dist.all_reduce(mean)  # every rank, at the same steps: a collective
                if group.is_chief:
                    accuracy = digits.evaluate(model, data)
                    metrics.log(step=done, loss=mean / group.world_size, accuracy=accuracy)
            if checkpointer is not None:
                if done == args.steps:
                    checkpointer.save(done)  # always: a later, longer run resumes from here
                else:
                    checkpointer.maybe_save(done)
            if args.step_seconds:
                time.sleep(args.step_seconds)

    ours = digest(model)
    digests: list[str | None] = [None] * group.world_size
    dist.all_gather_object(digests, ours)
    if group.is_chief:
        if accuracy is None:
            accuracy = digits.evaluate(model, data)
        result = {
            "world_size": group.world_size,
            "steps": args.steps,
            "sha256": ours,
            "ranks_agree": all(other == ours for other in digests),
            "accuracy": accuracy,
        }
        if args.result is not None:
            write_bytes_atomically(args.result, json.dumps(result, indent=2).encode())
        if args.weights is not None:
            weights = {name: t.detach().cpu() for name, t in model.state_dict().items()}
            with atomic_file(args.weights) as file:
                torch.save(weights, file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
