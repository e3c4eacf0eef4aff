"""Items checked against the input a model version declares (its metadata's `servable.input`),
at the API, before anything is queued: a wrong item is a 422 naming it and saying what was
expected, never a task that fails on a replica with a traceback.

The declared input is what the entry point takes: a batch, the list of one call's items. So an
array's (`ndarray`, `tensor`, `image`) shape is the batch's: its first dimension is the batch
(any number of items, whatever it says: batching decides how many a call gets) and the rest is
each item's, a dimension given as null of any size; `dtype` is what its elements are (without
one: numbers, booleans or strings). A scalar type (`string`, `number`, `integer`, `boolean`) is
each item's. `list` and `json` say nothing of the items, nor does `bytes` (JSON has no bytes:
how they are written is the model's affair).

Cheap, since a synchronous prediction waits on it: a walk of the nested lists that stops at the
first mismatch, each innermost row checked by C loops over it (`map`, `min`, `max`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.models.metadata import ARRAY_KINDS, DataType
from controlplane.refusals import Refusal, Refused

_INTEGERS = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1),
}
_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
_SHOWN_DEPTH = 32
"""The most dimensions a refusal's message reads of a value (the metadata's own bound)."""


@dataclass(frozen=True, slots=True)
class Elements:
    """What an array's elements, or a scalar item, may be."""

    many: str
    """What they are, said of several: 'float32 numbers'."""
    one: str
    """Said of one: 'a float32 number'."""
    types: frozenset[type]
    """Their Python types, exactly: a JSON boolean is no number, though Python's bool is an int."""
    integral: bool = False
    """Integers, which a float without a fraction also is (2.0, as JSON Schema reads it)."""
    low: int | None = None
    high: int | None = None

    def holds(self, value: object) -> bool:
        integral = self.integral and isinstance(value, float) and value.is_integer()
        if type(value) not in self.types and not integral:
            return False
        if self.low is None or self.high is None:
            return True
        return isinstance(value, int | float) and self.low <= value <= self.high

    def hold_all(self, values: list[Any]) -> bool:
        if not self.types.issuperset(map(type, values)):
            return all(map(self.holds, values))
        if self.low is None or self.high is None or not values:
            return True
        least: int = min(values)
        most: int = max(values)
        return self.low <= least and most <= self.high


_NUMBER_TYPES = frozenset({int, float})
_SCALARS = {
    "number": Elements("numbers", "a number", _NUMBER_TYPES),
    "integer": Elements("integers", "an integer", frozenset({int}), integral=True),
    "boolean": Elements("booleans", "a boolean", frozenset({bool})),
    "string": Elements("strings", "a string", frozenset({str})),
}
_SCALAR_ELEMENTS = Elements(
    "numbers, booleans or strings",
    "a number, boolean or string",
    frozenset({int, float, bool, str}),
)


@dataclass(frozen=True, slots=True)
class DeclaredInput:
    """What each item of a request must be, from a declared input."""

    dims: tuple[int | None, ...] | None
    """Each item's dimensions (the declared shape but the batch's); None: an array of any."""
    elements: Elements
    expected: str
    """What an item must be, for a refusal's message."""
    declared: str = ""
    """The declared shape, said after what came: ' (the model takes [*, 64])'."""


def declared_input(declared: DataType) -> DeclaredInput | None:
    """What `declared` asks of each item; None: nothing (`list`, `json`, `bytes`)."""
    if declared.type in ARRAY_KINDS:
        elements = _array_elements(declared.dtype)
        if not declared.shape:
            return DeclaredInput(None, elements, f"arrays of {elements.many}")
        dims = tuple(declared.shape[1:])
        whole = _shape_text(declared.shape)
        item = (
            elements.one if not dims else f"an item of shape {_shape_text(dims)} of {elements.many}"
        )
        return DeclaredInput(dims, elements, item, f" (the model takes {whole})")
    scalar = _SCALARS.get(declared.type)
    return None if scalar is None else DeclaredInput((), scalar, scalar.one)


def check_items(declared: DeclaredInput | None, items: list[Any], field: str) -> None:
    """Refusal (INVALID) naming the first item of `items` that `declared` does not take, as
    `field.N`, with what was expected and what came."""
    if declared is None:
        return
    if declared.dims is None:
        path = _any_shape_departure(items, declared.elements, ())
    else:
        path = _departure(items, (None, *declared.dims), declared.elements)
    if path is None:
        return
    index, inner = path[0], path[1:]
    value = items[index]
    for step in inner:
        value = value[step]
    where = "".join(f"[{step}]" for step in inner)
    got = _described(value) + (f" at {where}" if where else "")
    raise Refusal(
        Refused.INVALID,
        f"expected {declared.expected}, got {got}{declared.declared}",
        field=f"{field}.{index}",
    )


def check_generated(declared: DeclaredInput | None, shape: Sequence[int], field: str) -> None:
    """Refusal (INVALID) naming `field` when items generated as float32 arrays of `shape`
    (runners/inputs.py) are not what `declared` takes."""
    if declared is None:
        return
    fits = declared.elements.holds(0.5) and (
        declared.dims is None
        or (
            len(shape) == len(declared.dims)
            and all(
                want is None or want == size
                for want, size in zip(declared.dims, shape, strict=True)
            )
        )
    )
    if not fits:
        raise Refusal(
            Refused.INVALID,
            f"expected {declared.expected}, got generated items of shape "
            f"{_shape_text(shape)} of float32 numbers{declared.declared}",
            field=field,
        )


def _array_elements(dtype: str | None) -> Elements:
    if dtype is None:
        return _SCALAR_ELEMENTS
    if dtype in _FLOATS:
        return Elements(f"{dtype} numbers", f"a {dtype} number", _NUMBER_TYPES)
    if dtype == "bool":
        return _SCALARS["boolean"]
    if dtype == "string":
        return _SCALARS["string"]
    low, high = _INTEGERS[dtype]
    span = f"from {low} to {high}"
    return Elements(
        f"{dtype} integers {span}",
        f"{'an' if dtype.startswith('int') else 'a'} {dtype} integer {span}",
        frozenset({int}),
        integral=True,
        low=low,
        high=high,
    )


def _departure(
    value: Any, dims: tuple[int | None, ...], elements: Elements
) -> tuple[int, ...] | None:
    """Where `value` first departs from an array of `dims` of `elements`, as the indices that
    lead there; None where it does not."""
    if not dims:
        return None if elements.holds(value) else ()
    size, inner = dims[0], dims[1:]
    if type(value) is not list or (size is not None and len(value) != size):
        return ()
    if not inner:
        if elements.hold_all(value):
            return None
        return (next(i for i, element in enumerate(value) if not elements.holds(element)),)
    for index, element in enumerate(value):
        found = _departure(element, inner, elements)
        if found is not None:
            return (index, *found)
    return None


def _any_shape_departure(
    value: Any, elements: Elements, path: tuple[int, ...]
) -> tuple[int, ...] | None:
    """As `_departure`, for arrays of any shape: only their elements are checked."""
    if type(value) is not list:
        return None if elements.holds(value) else path
    if elements.hold_all(value):
        return None
    for index, element in enumerate(value):
        found = _any_shape_departure(element, elements, (*path, index))
        if found is not None:
            return found
    return None


def _described(value: Any) -> str:
    if isinstance(value, list):
        shape: list[int | None] = []
        while isinstance(value, list) and len(shape) < _SHOWN_DEPTH:
            shape.append(len(value))
            if not value:
                break
            value = value[0]
        return f"shape {_shape_text(shape)}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "an object"
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:21]}..."


def _shape_text(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("*" if size is None else str(size) for size in shape) + "]"
