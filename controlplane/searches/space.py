"""A search space: what each hyperparameter of a trial may be, validated in full before a search
is written (a tenant's space is hostile input: its bounds, sizes and nesting are capped), and
the pure ways searchers draw from it: at random, as the k-th point of a grid, and as a mutation
of a point (for evolution).

A space maps names to parameters: `uniform` and `log_uniform` reals, `int` ranges (both ends
included), a `choice` among values, and `repeat`, a list of MIN to MAX items each drawn from a
space of its own: an architecture's layers, each with its width and activation. A point is a
JSON object of the same names, which the trial's learner gets as it is."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

MAX_PARAMS = 32
MAX_CHOICES = 64
MAX_REPEAT = 16
MAX_BOUND = 1e15
"""No bound of a real parameter beyond this: a learner's lr of 1e300 is a typo or an attack."""
MIN_LOG_BOUND = 1e-30
"""No bound of a log-uniform parameter below this: the grid spreads its points by the ratio
high / low, which a tiny low (5e-324) made infinite, and its first point NaN."""
MAX_INT = 2**31 - 1

Name = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_]{0,63}$")]
Scalar = (
    bool
    | int
    | Annotated[float, Field(allow_inf_nan=False)]
    | Annotated[str, StringConstraints(max_length=200)]
)
Point = dict[str, Any]


class _Param(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Uniform(_Param):
    type: Literal["uniform"]
    low: float = Field(
        ge=-MAX_BOUND, le=MAX_BOUND, allow_inf_nan=False, description="less than high"
    )
    high: float = Field(ge=-MAX_BOUND, le=MAX_BOUND, allow_inf_nan=False)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if not self.low < self.high:
            raise ValueError("low must be less than high")
        return self


class LogUniform(_Param):
    type: Literal["log_uniform"]
    low: float = Field(
        ge=MIN_LOG_BOUND, le=MAX_BOUND, allow_inf_nan=False, description="less than high"
    )
    high: float = Field(ge=MIN_LOG_BOUND, le=MAX_BOUND, allow_inf_nan=False)

    @model_validator(mode="after")
    def _ordered(self) -> LogUniform:
        if not self.low < self.high:
            raise ValueError("low must be less than high")
        return self


class Integer(_Param):
    type: Literal["int"]
    low: int = Field(ge=-MAX_INT, le=MAX_INT, description="at most high")
    high: int = Field(ge=-MAX_INT, le=MAX_INT)

    @model_validator(mode="after")
    def _ordered(self) -> Integer:
        if not self.low <= self.high:
            raise ValueError("low must be at most high")
        return self


class Choice(_Param):
    type: Literal["choice"]
    values: list[Scalar] = Field(min_length=1, max_length=MAX_CHOICES)


class Repeat(_Param):
    """MIN to MAX items, each a point of `item` (itself without a `repeat`: one level deep)."""

    type: Literal["repeat"]
    min: int = Field(ge=1, le=MAX_REPEAT, description="at most max")
    max: int = Field(ge=1, le=MAX_REPEAT)
    item: dict[
        Name, Annotated[Uniform | LogUniform | Integer | Choice, Field(discriminator="type")]
    ] = Field(min_length=1, max_length=MAX_PARAMS)

    @model_validator(mode="after")
    def _ordered(self) -> Repeat:
        if not self.min <= self.max:
            raise ValueError("min must be at most max")
        return self


Param = Annotated[Uniform | LogUniform | Integer | Choice | Repeat, Field(discriminator="type")]


def within_bounds(space: dict[str, Any]) -> dict[str, Any]:
    """A stored space (as JSON data) with the log-uniform bounds accepted before their floor
    (they had only to be > 0) raised to MIN_LOG_BOUND, so that its search still reads."""

    def bounded(params: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        for name, param in params.items():
            if isinstance(param, dict) and param.get("type") == "log_uniform":
                param = {
                    **param,
                    **{
                        end: MIN_LOG_BOUND
                        for end in ("low", "high")
                        if isinstance(param.get(end), int | float) and param[end] < MIN_LOG_BOUND
                    },
                }
            elif isinstance(param, dict) and isinstance(param.get("item"), dict):
                param = {**param, "item": bounded(param["item"])}
            out[name] = param
        return out

    params = space.get("params")
    return {**space, "params": bounded(params)} if isinstance(params, dict) else space


Leaf = Uniform | LogUniform | Integer | Choice


class Space(BaseModel):
    """The hyperparameters' names and what each may be."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: dict[Name, Param] = Field(min_length=1, max_length=MAX_PARAMS)


REAL_CHARS = 25
"""The longest a real takes as JSON (`-1.2345678901234567e-308`)."""


def max_point_chars(space: Space) -> int:
    """The most characters a point of `space` takes as compact JSON (as its learners get it):
    a bound, so that a space whose points could not be given to a learner is refused whole."""
    return _object_chars(space.params)


def _object_chars(params: Mapping[str, Param]) -> int:
    # Braces, and per member its name, a colon, its value and a comma.
    return 2 + sum(len(json.dumps(name)) + 2 + _value_chars(p) for name, p in params.items())


def _value_chars(param: Param) -> int:
    match param:
        case Uniform() | LogUniform():
            return REAL_CHARS
        case Integer():
            return max(len(str(param.low)), len(str(param.high)))
        case Choice():
            return max(len(json.dumps(value)) for value in param.values)
        case Repeat():
            return 2 + param.max * (_object_chars(param.item) + 1)


def sample(space: Space, rng: random.Random) -> Point:
    """A point drawn at random, each parameter on its own."""
    return {name: _draw(param, rng) for name, param in space.params.items()}


def _draw(param: Param, rng: random.Random) -> Any:
    match param:
        case Repeat():
            count = rng.randint(param.min, param.max)
            return [{n: _draw(p, rng) for n, p in param.item.items()} for _ in range(count)]
        case _:
            return _leaf(param, rng)


def _leaf(param: Leaf, rng: random.Random) -> Any:
    match param:
        case Uniform():
            return rng.uniform(param.low, param.high)
        case LogUniform():
            drawn = math.exp(rng.uniform(math.log(param.low), math.log(param.high)))
            return min(max(drawn, param.low), param.high)
        case Integer():
            return rng.randint(param.low, param.high)
        case Choice():
            return rng.choice(param.values)


def grid_size(space: Space, points: int) -> int:
    """How many points the grid has, with `points` (2 or more) values for each real
    parameter."""
    return math.prod(len(_axis(param, points)) for param in space.params.values())


def grid_point(space: Space, k: int, points: int) -> Point:
    """The k-th point of the grid (0 first, the last parameter varying fastest), computed from k
    alone: a search rebuilt from its events needs no enumeration state."""
    axes = [_axis(param, points) for param in space.params.values()]
    if not 0 <= k < math.prod(len(axis) for axis in axes):
        raise IndexError(f"the grid has no point {k}")
    chosen = []
    for axis in reversed(axes):
        k, index = divmod(k, len(axis))
        chosen.append(axis[index])
    return dict(zip(space.params, reversed(chosen), strict=True))


def _axis(param: Param, points: int) -> list[Any]:
    """A parameter's grid values: `points` evenly spread reals (geometrically, for log_uniform),
    every integer when there are no more than `points` (else `points` spread), every choice,
    and for `repeat` every count, each item at the middle of its own space."""
    match param:
        case Uniform():
            return [param.low + (param.high - param.low) * i / (points - 1) for i in range(points)]
        case LogUniform():
            ratio = math.log(param.high / param.low)
            # Clamped: exp(log(x)) may come out a hair past the bound.
            return [
                min(max(param.low * math.exp(ratio * i / (points - 1)), param.low), param.high)
                for i in range(points)
            ]
        case Integer():
            span = param.high - param.low
            if span < points:
                return list(range(param.low, param.high + 1))
            return sorted({param.low + round(span * i / (points - 1)) for i in range(points)})
        case Choice():
            return list(param.values)
        case Repeat():
            middle = {name: _middle(p) for name, p in param.item.items()}
            return [
                [dict(middle) for _ in range(count)] for count in range(param.min, param.max + 1)
            ]


def _middle(param: Leaf) -> Any:
    match param:
        case Uniform():
            return (param.low + param.high) / 2
        case LogUniform():
            return math.sqrt(param.low * param.high)
        case Integer():
            return (param.low + param.high) // 2
        case Choice():
            return param.values[len(param.values) // 2]


def mutate(space: Space, point: Mapping[str, Any], rng: random.Random) -> Point:
    """The point with one parameter changed (drawn again; for `repeat`, an item added, removed
    or one of its values drawn again), as regularized evolution mutates an architecture."""
    child = {name: _copy(value) for name, value in point.items()}
    name = rng.choice(sorted(space.params))
    param = space.params[name]
    if not isinstance(param, Repeat):
        child[name] = _leaf(param, rng)
        return child
    items: list[dict[str, Any]] = child[name]
    moves = ["change"]
    if len(items) < param.max:
        moves.append("add")
    if len(items) > param.min:
        moves.append("remove")
    match rng.choice(moves):
        case "add":
            items.insert(
                rng.randint(0, len(items)), {n: _leaf(p, rng) for n, p in param.item.items()}
            )
        case "remove":
            items.pop(rng.randrange(len(items)))
        case _:
            item = rng.choice(items)
            key = rng.choice(sorted(param.item))
            item[key] = _leaf(param.item[key], rng)
    return child


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return [dict(item) for item in value]
    return value


def contains(space: Space, point: Mapping[str, Any]) -> bool:
    """Whether the point is one of the space's (every name, each value within its parameter)."""
    if set(point) != set(space.params):
        return False
    return all(_within(param, point[name]) for name, param in space.params.items())


def _within(param: Param, value: Any) -> bool:
    match param:
        case Repeat():
            return (
                isinstance(value, list)
                and param.min <= len(value) <= param.max
                and all(
                    isinstance(item, dict)
                    and set(item) == set(param.item)
                    and all(_within(p, item[n]) for n, p in param.item.items())
                    for item in value
                )
            )
        case Choice():
            return any(value == v and type(value) is type(v) for v in param.values)
        case Integer():
            return isinstance(value, int) and param.low <= value <= param.high
        case Uniform() | LogUniform():
            return isinstance(value, float) and param.low <= value <= param.high
