"""What a user asks for when submitting an inference job (POST /v1/inference, `trainyard
infer`): validated in full before anything is written; unknown fields are refused.

A query is one batch: `batch_size` items, the job's items `index * batch_size` on. The items
come from a generator (endless unless `queries` says how many; each item a pure function of the
seed and its number, generated where the query runs, so nothing but the index crosses the
database) or from a list given with the job (its queries cover the list once)."""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from controlplane.deployments.spec import MAX_BATCH_SIZE, MAX_TASK_TIMEOUT_S, Resources
from controlplane.jobs.manifest import (
    MAX_LABELS,
    MAX_QUERIES,
    MAX_REPLICAS,
    MAX_WEIGHT,
    MIN_TIMEOUT_S,
    MIN_WEIGHT,
    check_storable,
)
from controlplane.models.references import MAX_REFERENCE_CHARS, REFERENCE_PATTERN

MAX_DIMENSIONS = 4
MAX_ITEM_ELEMENTS = 1 << 24
"""A generated item's numbers at most (a 3x224x224 image has 150,528)."""
MAX_ITEMS = 100_000
MAX_ITEMS_BYTES = 1 << 20
"""A list of items travels in the job's manifest (kept forever in its history): 1 MiB."""


class Generate(BaseModel):
    """Generated items: float32 arrays of `shape`, standard normal, from the seed and each
    item's number (runners/inputs.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shape: list[int] = Field(
        min_length=1,
        max_length=MAX_DIMENSIONS,
        description=f"an item's shape, e.g. [3, 224, 224] (at most {MAX_ITEM_ELEMENTS} numbers)",
        # What `_size` checks of each dimension (their product is left to the description).
        json_schema_extra={
            "items": {"type": "integer", "minimum": 1, "maximum": MAX_ITEM_ELEMENTS}
        },
    )
    seed: int = Field(default=0, ge=0, le=2**63 - 1)

    @field_validator("shape")
    @classmethod
    def _size(cls, value: list[int]) -> list[int]:
        if any(size < 1 for size in value):
            raise ValueError("every dimension must be at least 1")
        if math.prod(value) > MAX_ITEM_ELEMENTS:
            raise ValueError(f"an item may hold at most {MAX_ITEM_ELEMENTS} numbers")
        return value


def _one_of_schema(schema: dict[str, Any]) -> None:
    """`_one_source`, stated in the schema: an input set is either one (the other null)."""
    properties = schema.pop("properties")
    # Unknown fields are refused in each branch: beside no `properties`, it would refuse all.
    closed = {"additionalProperties": schema.pop("additionalProperties")}
    generated, given = properties["generate"], properties["items"]
    schema["anyOf"] = [
        {
            "properties": {"generate": generated["anyOf"][0], "items": {"type": "null"}},
            "required": ["generate"],
            **closed,
        },
        {
            "properties": {"items": given["anyOf"][0], "generate": {"type": "null"}},
            "required": ["items"],
            **closed,
        },
    ]


class InputSet(BaseModel):
    """Where the queries' items come from: `generate` or `items`, exactly one."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_one_of_schema)

    generate: Generate | None = None
    items: list[Any] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ITEMS,
        description=f"the items themselves (JSON, {MAX_ITEMS_BYTES // 1024} KiB at most)",
    )

    @field_validator("items")
    @classmethod
    def _items_size(cls, value: list[Any] | None) -> list[Any] | None:
        if value is None:
            return value
        check_storable(value)
        if len(json.dumps(value, allow_nan=False)) > MAX_ITEMS_BYTES:
            raise ValueError(f"the items exceed {MAX_ITEMS_BYTES // 1024} KiB as JSON")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> InputSet:
        if (self.generate is None) == (self.items is None):
            raise ValueError("give exactly one of generate and items")
        return self


class InferenceRequest(BaseModel):
    """POST /v1/inference: run a model version over an input set, one query per batch."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="the job's name",
    )
    model: str = Field(
        max_length=MAX_REFERENCE_CHARS,
        json_schema_extra={"pattern": REFERENCE_PATTERN},
        description="the model version: name, name:3, name@alias, or tenant/name... for another "
        "tenant's public model; resolved once, when submitted",
    )
    input: InputSet
    batch_size: int = Field(default=16, ge=1, le=MAX_BATCH_SIZE, description="items per query")
    queries: int | None = Field(
        default=None,
        ge=1,
        le=MAX_QUERIES,
        description="how many queries to run; by default, until cancelled (generated items) "
        "or once over the items given",
    )
    weight: float = Field(
        default=1.0,
        ge=MIN_WEIGHT,
        le=MAX_WEIGHT,
        description="its share against the other inference jobs running: query throughput "
        "in proportion to the weights",
    )
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS, description="replicas running it")
    resources: Resources = Field(default_factory=Resources)
    query_timeout_s: float = Field(
        default=60.0,
        ge=MIN_TIMEOUT_S,
        le=MAX_TASK_TIMEOUT_S,
        description="a replica that holds a query longer is replaced, and the query retried",
    )
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)

    @model_validator(mode="after")
    def _queries_fit_items(self) -> InferenceRequest:
        items = self.input.items
        if items is not None and self.queries is not None:
            most = math.ceil(len(items) / self.batch_size)
            if self.queries > most:
                raise ValueError(
                    f"queries: {len(items)} items in batches of {self.batch_size} make "
                    f"{most} queries, not {self.queries}"
                )
        return self

    @property
    def query_count(self) -> int | None:
        """How many queries it runs; None: until cancelled."""
        if self.queries is not None or self.input.items is None:
            return self.queries
        return math.ceil(len(self.input.items) / self.batch_size)
