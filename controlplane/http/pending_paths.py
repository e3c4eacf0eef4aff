"""The OpenAPI description of a job's pending reasons (`controlplane.http.pending`), derived
from its operations."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane.http.operations import REF, described, models_of
from controlplane.http.pending import OPERATIONS

SCHEMAS: tuple[type[BaseModel], ...] = tuple(models_of(OPERATIONS))
"""The component schemas these routes name."""


def openapi_paths() -> dict[str, Any]:
    return described(OPERATIONS, {"$ref": REF + "Error"})
