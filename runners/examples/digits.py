"""Architecture search's example trial: an MLP on scikit-learn's handwritten digits, its
architecture and training taken from the trial's hyperparameters.

    TRAINYARD_CHECKPOINT_DIR=/tmp/ckpt python -m runners.launch -- \\
        python -m runners.examples.digits --epochs 20

The data is the 8x8 digits set that ships inside scikit-learn (1797 images, no download), split
once from the seed into 1437 training and 360 validation images. The network is `layers` (each a
`width` and an `activation`: relu, tanh, gelu or sigmoid) then a linear layer to the 10 classes,
with `dropout` after each hidden layer, trained by Adam at `lr` in batches of `batch_size`.

In a search trial (TRAINYARD_HPARAMS set, see `runners.hparams`), the hyperparameters are the
trial's point and the number of epochs is TRAINYARD_BUDGET, which must count epochs (a trial
given steps fails at once, saying so). Outside one, it trains `DEFAULTS` for `--epochs`. Either
way it reports `accuracy` (on the validation images) and `loss` (the epoch's mean training loss)
after every epoch, and saves a checkpoint at the end of its budget: a promoted trial's next job
resumes there and trains on to its larger budget, exactly as if it had never stopped.

Each epoch's randomness (batch order, dropout masks) is drawn from the seed and the epoch alone,
so resuming needs only the model and the optimizer, and training in-process (the search
benchmark, `bench/search_quality.py`) touches no global generator.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn

from runners import hparams, metrics
from runners.checkpoint import Checkpointer
from runners.config import RESULTS_DIR, ConfigError
from runners.durable import atomic_file, write_bytes_atomically

FEATURES = 64
CLASSES = 10
VALIDATION = 360
"""Images held out for validation (of 1797): a fifth."""
PIXEL_MAX = 16.0
"""The data set's pixels are whole numbers from 0 to 16."""
BUNDLED = ("datasets", "data", "digits.csv.gz")
"""Where scikit-learn keeps the digits, in its package: a row per image, its 64 pixels then its
label."""

Activation = Literal["relu", "tanh", "gelu", "sigmoid"]
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
}


class Layer(BaseModel):
    """One hidden layer: its width and the activation after it."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    width: int = Field(ge=1, le=4096)
    activation: Activation


class Hparams(BaseModel):
    """What a trial's point may hold; anything else is refused, so that a misspelt name in a
    search space fails the trial instead of being silently ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    lr: float = Field(gt=0, le=10, allow_inf_nan=False)
    layers: list[Layer] = Field(min_length=1, max_length=16)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    batch_size: int = Field(default=64, ge=1, le=4096)


DEFAULTS: dict[str, Any] = {
    "lr": 2e-3,
    "layers": [{"width": 128, "activation": "relu"}, {"width": 64, "activation": "relu"}],
    "dropout": 0.1,
    "batch_size": 64,
}
"""What a run outside a search trains: about 0.98 accuracy after 20 epochs."""


def parse(point: Mapping[str, Any]) -> Hparams:
    """The hyperparameters of a trial's point; ValueError saying what is wrong."""
    try:
        return Hparams.model_validate(dict(point))
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'point'}: {e['msg']}"
            for e in error.errors()
        )
        raise ValueError(f"bad hyperparameters: {problems}") from None


@dataclass(frozen=True)
class Digits:
    train_inputs: torch.Tensor
    train_labels: torch.Tensor
    valid_inputs: torch.Tensor
    valid_labels: torch.Tensor


def load(seed: int) -> Digits:
    """The digits, pixels scaled to [0, 1], split into training and validation images by a
    permutation drawn from the seed: every trial of a search validates on the same images."""
    images, labels = bundled_digits()
    inputs = torch.tensor(images, dtype=torch.float32) / PIXEL_MAX
    targets = torch.tensor(labels, dtype=torch.int64)
    order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(seed))
    valid, train = order[:VALIDATION], order[VALIDATION:]
    return Digits(inputs[train], targets[train], inputs[valid], targets[valid])


def bundled_digits() -> tuple[list[list[int]], list[int]]:
    """The images' pixels and their labels, as scikit-learn's `load_digits` gives them, read
    from the file it ships without importing it: scikit-learn's import (scipy's with it) took
    2 s of every learner's start on two cores, more than a short trial trains."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the digits ship with scikit-learn, which is not installed")
    path = Path(spec.submodule_search_locations[0], *BUNDLED)
    with gzip.open(path, "rt") as rows:
        table = [[int(value) for value in row.split(",")] for row in rows]
    return [row[:-1] for row in table], [row[-1] for row in table]


def build(point: Hparams, seed: int) -> nn.Sequential:
    """The network the hyperparameters describe, its initial weights drawn from the seed."""
    modules: list[nn.Module] = []
    width = FEATURES
    with _seeded(seed):
        for layer in point.layers:
            modules += [nn.Linear(width, layer.width), ACTIVATIONS[layer.activation]()]
            if point.dropout > 0:
                modules.append(nn.Dropout(point.dropout))
            width = layer.width
        modules.append(nn.Linear(width, CLASSES))
    return nn.Sequential(*modules)


def optimizer_for(model: nn.Module, point: Hparams) -> torch.optim.Optimizer:
    # A constant learning rate: the budget a trial ends up with is not known when it starts (a
    # promotion extends it), so a schedule over it would change the first epochs' training.
    return torch.optim.Adam(model.parameters(), lr=point.lr)


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Digits,
    point: Hparams,
    *,
    epoch: int,
    seed: int,
) -> float:
    """Train one epoch (0 first); return its mean training loss. The batch order and the
    dropout masks are drawn from (seed, epoch) alone."""
    model.train()
    total = 0.0
    count = len(data.train_labels)
    with _seeded(_epoch_seed(seed, epoch)):
        order = torch.randperm(count)
        for first in range(0, count, point.batch_size):
            batch = order[first : first + point.batch_size]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(
                model(data.train_inputs[batch]), data.train_labels[batch]
            )
            torch.autograd.backward(loss)  # loss.backward(), in its type-annotated spelling
            optimizer.step()
            total += loss.item() * len(batch)
    return total / count


def train_epochs(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Digits,
    point: Hparams,
    *,
    start: int,
    end: int,
    seed: int,
) -> float | None:
    """Train from epoch `start` (epochs done) to `end`; the last epoch's mean training loss, or
    None when there was nothing to train."""
    loss = None
    for epoch in range(start, end):
        loss = train_epoch(model, optimizer, data, point, epoch=epoch, seed=seed)
    return loss


def evaluate(model: nn.Module, data: Digits) -> float:
    """Accuracy on the validation images, without dropout."""
    model.eval()
    with torch.no_grad():
        predicted = model(data.valid_inputs).argmax(dim=1)
    return float((predicted == data.valid_labels).float().mean())


def _epoch_seed(seed: int, epoch: int) -> int:
    # Hashed rather than added: seed 1's epoch 0 must not replay seed 0's epoch 1.
    digest = hashlib.sha256(f"{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """torch's global generator seeded for the block, and back as it was after it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.examples.digits")
    parser.add_argument("--seed", type=int, default=0, help="the data split, weights and batches")
    parser.add_argument(
        "--epochs", type=int, default=20, help="outside a search (a trial's is TRAINYARD_BUDGET)"
    )
    args = parser.parse_args(argv)
    try:
        trial = hparams.load()
        point = parse(DEFAULTS if trial is None else trial.hparams)
    except (ConfigError, ValueError) as error:
        parser.error(str(error))
    if trial is not None and trial.unit != "epochs":
        parser.error(f"this example counts epochs; the search's budget is in {trial.unit}")
    epochs = args.epochs if trial is None else trial.budget

    # One thread: on the CPU this network's kernels are then deterministic, so a resumed run is
    # bit-identical to one never stopped (see `digits_ddp` for CUDA's).
    torch.set_num_threads(1)
    data = load(args.seed)
    model = build(point, args.seed)
    optimizer = optimizer_for(model, point)
    try:
        checkpointer = Checkpointer.from_env({"model": model, "optimizer": optimizer})
    except ConfigError as error:
        parser.error(str(error))
    start = checkpointer.resume()
    if start > epochs:
        parser.error(f"the checkpoint is of epoch {start}, past the {epochs} epochs to train")

    with checkpointer:
        for epoch in range(start, epochs):
            loss = train_epoch(model, optimizer, data, point, epoch=epoch, seed=args.seed)
            done = epoch + 1
            metrics.log(step=done, accuracy=evaluate(model, data), loss=loss)
            if done == epochs:
                # Always, whatever the interval: a promotion resumes from here.
                checkpointer.save(done)
            else:
                checkpointer.maybe_save(done)
    accuracy = evaluate(model, data)
    if start == epochs:
        # An attempt restarted after its last save: nothing to train, but the search still
        # reads the metric from this job's reports.
        metrics.log(step=epochs, accuracy=accuracy)
    results = os.environ.get(RESULTS_DIR)
    if results:
        _write_results(Path(results), model, point, epochs, accuracy)
    return 0


def _write_results(
    directory: Path, model: nn.Module, point: Hparams, epochs: int, accuracy: float
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_file(directory / "model.pt") as file:
        torch.save(model.state_dict(), file)
    result = {"hparams": point.model_dump(), "epochs": epochs, "accuracy": accuracy}
    write_bytes_atomically(directory / "result.json", json.dumps(result, indent=2).encode())


if __name__ == "__main__":
    raise SystemExit(main())
