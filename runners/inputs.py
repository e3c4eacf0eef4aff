"""Generated inputs: item number `index` of an endless, deterministic input set.

The queries of an endless inference job are generated where they run, from their index alone:
nothing but the index crosses the database, and any replica, any batch size and any retry gives
the same item for the same (seed, index). Each item has its own generator, seeded with
`[seed, index]`, so an item never depends on which batch it falls in or what came before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MAX_DIMS = 4
MAX_ELEMENTS = 1 << 24  # 64 MiB of float32 per item: more would not be an inference query


def generated(shape: Sequence[int], seed: int, index: int) -> np.ndarray:
    """Item `index` of the set `seed`: standard-normal float32 values of `shape`."""
    dims = _checked_shape(shape)
    _check_non_negative(seed=seed, index=index)
    return _draw(dims, seed, index)


def generated_batch(shape: Sequence[int], seed: int, first: int, count: int) -> list[np.ndarray]:
    """Items `first` to `first + count - 1` of the set `seed`, each as `generated` gives it."""
    dims = _checked_shape(shape)
    _check_non_negative(seed=seed, first=first, count=count)
    return [_draw(dims, seed, index) for index in range(first, first + count)]


def _draw(dims: tuple[int, ...], seed: int, index: int) -> np.ndarray:
    # float32 straight from the generator: half the memory and time of drawing float64.
    return np.random.default_rng([seed, index]).standard_normal(dims, dtype=np.float32)


def _checked_shape(shape: Sequence[int]) -> tuple[int, ...]:
    dims = tuple(shape)
    if not 1 <= len(dims) <= MAX_DIMS:
        raise ValueError(f"shape {dims} has {len(dims)} dimensions; it needs 1 to {MAX_DIMS}")
    # bool is an int to Python, but True as a dimension is a mistake, not a 1.
    integral = all(isinstance(dim, int | np.integer) and not isinstance(dim, bool) for dim in dims)
    if not integral or not all(dim > 0 for dim in dims):
        raise ValueError(f"shape {dims} has a dimension that is not a positive integer")
    dims = tuple(int(dim) for dim in dims)
    # Python's integers, not numpy's: a product of huge dimensions must not wrap around.
    elements = math.prod(dims)
    if elements > MAX_ELEMENTS:
        raise ValueError(
            f"shape {dims} has {elements} elements per item; at most {MAX_ELEMENTS} are allowed"
        )
    return dims


def _check_non_negative(**numbers: int) -> None:
    for name, number in numbers.items():
        if number < 0:
            raise ValueError(f"{name} must be >= 0, not {number}")
