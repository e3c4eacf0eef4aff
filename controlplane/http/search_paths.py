"""The OpenAPI description of searches (`controlplane.http.searches`), derived from its
operations."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane.http import metrics, pending_paths
from controlplane.http.operations import REF, described, models_of
from controlplane.http.searches import OPERATIONS

SCHEMAS: tuple[type[BaseModel], ...] = (
    *models_of(OPERATIONS),
    *pending_paths.SCHEMAS,
    *metrics.SCHEMAS,
)
"""The component schemas these routes name; and, until controlplane.http.openapi names them
itself, those of the pending reasons' and the metrics' routes."""


def openapi_paths() -> dict[str, Any]:
    return described(OPERATIONS, {"$ref": REF + "Error"})
