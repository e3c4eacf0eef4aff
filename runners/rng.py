"""The random number generators' states, captured into and restored from a checkpoint.

Restoring them is what makes a resumed run continue exactly like an uninterrupted one: dropout
masks, random augmentation and sampling draw the same numbers they would have drawn. Covered: the
Python `random` module, torch's CPU generator, every CUDA device's generator, and numpy's global
generator if numpy is installed. Generators a script creates itself (`torch.Generator`,
`numpy.random.Generator`) are its own state to checkpoint.

States are stored as tensors, numbers, strings and lists only, so that checkpoints load with
`torch.load(weights_only=True)`, which runs no pickled code.
"""

from __future__ import annotations

import importlib
import random
from types import ModuleType
from typing import Any

import torch


def capture() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    states: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    numpy = _numpy()
    if numpy is not None:
        algorithm, keys, position, has_gauss, cached_gauss = numpy.random.get_state()
        states["numpy"] = [algorithm, keys.tolist(), position, has_gauss, cached_gauss]
    return states


def restore(states: dict[str, Any]) -> None:
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(states["torch"])
    # A checkpoint moves between machines: restore the devices both sides have, and leave a
    # state this machine cannot use (CUDA, numpy) alone.
    if "cuda" in states and torch.cuda.is_available():
        for device, state in enumerate(states["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, device)
    numpy = _numpy()
    if "numpy" in states and numpy is not None:
        algorithm, keys, position, has_gauss, cached_gauss = states["numpy"]
        keys_array = numpy.asarray(keys, dtype=numpy.uint32)
        numpy.random.set_state((algorithm, keys_array, position, has_gauss, cached_gauss))


def _numpy() -> ModuleType | None:
    # Imported by name rather than statically: numpy is optional for a torch training script.
    try:
        return importlib.import_module("numpy")
    except ModuleNotFoundError:
        return None
