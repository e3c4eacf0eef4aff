"""Request bodies are read as their JSON Schema reads them: a value of another JSON type is
refused (lax conversion took `false` for 0 and `"1"` for 1: schemathesis, issue 33), and a
number with no fraction is an integer (the schema's `integer` allows 2.0)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import pytest
from aiohttp import web
from pydantic import BaseModel, Field

from controlplane.http.requests import validated


class Inner(BaseModel):
    n: int


class Slow(BaseModel):
    name: Literal["slow"]
    steps: int


class Fast(BaseModel):
    name: Literal["fast"]
    steps: int
    jump: int


class Body(BaseModel):
    count: int
    rate: float = 1.0
    name: str = ""
    flag: bool = False
    items: list[Inner] = []
    counts: dict[str, int] = {}
    mode: Annotated[Slow | Fast, Field(discriminator="name")] | None = None


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"count": False}, "count"),
        ({"count": "1"}, "count"),
        ({"count": 2.5}, "count"),
        ({"count": 1, "rate": "1.5"}, "rate"),
        ({"count": 1, "name": 7}, "name"),
        ({"count": 1, "flag": 1}, "flag"),
        ({"count": 1, "items": [{"n": "2"}]}, "items.0.n"),
    ],
)
def test_a_value_of_another_json_type_is_refused_naming_its_field(
    document: dict[str, object], field: str
) -> None:
    with pytest.raises(web.HTTPUnprocessableEntity) as refused:
        validated(Body, document)
    assert [f["field"] for f in json.loads(refused.value.text or "")["fields"]] == [field]


def test_a_number_with_no_fraction_is_an_integer_wherever_one_is_asked_for() -> None:
    body = validated(Body, {"count": 2.0, "rate": 3, "items": [{"n": 4.0}], "counts": {"a": 5.0}})
    assert (body.count, body.rate, body.items[0].n, body.counts) == (2, 3.0, 4, {"a": 5})
    assert type(body.count) is int and type(body.rate) is float


def test_an_integral_float_is_an_integer_in_a_tagged_union_too() -> None:
    # pydantic names the branch in the error's path (mode.fast.steps), which the body has not.
    body = validated(Body, {"count": 1, "mode": {"name": "fast", "steps": 569.0, "jump": 6.0}})
    assert body.mode == Fast(name="fast", steps=569, jump=6)
    with pytest.raises(web.HTTPUnprocessableEntity):
        validated(Body, {"count": 1, "mode": {"name": "fast", "steps": 5.5, "jump": 6.0}})
