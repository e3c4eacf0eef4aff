"""The OpenAPI description of serving's routes, made from their declarations
(`controlplane.http.deployments.OPERATIONS`): the models the handlers validate with and the
facade answers with."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane.http import operations
from controlplane.http.deployments import OPERATIONS
from controlplane.http.operations import REF

SCHEMAS: tuple[type[BaseModel], ...] = tuple(operations.models_of(OPERATIONS))
"""The component schemas these routes name."""


def openapi_paths() -> dict[str, Any]:
    return operations.described(OPERATIONS, {"$ref": REF + "Error"})
