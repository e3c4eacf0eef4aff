"""The OpenAPI description of the model repository's routes, derived from their declarations
(`controlplane.http.models.OPERATIONS`), and of the notifications a model's webhook receives.

`REF`, `answer`, `path_param` and `request_body` are the helpers the hand-written descriptions
of other routes still use."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane.http import operations
from controlplane.http.models import OPERATIONS
from controlplane.models.events import NOTIFIED
from controlplane.models.publication import Publication

REF = operations.REF
SCHEMAS: tuple[type[BaseModel], ...] = (*operations.models_of(OPERATIONS), Publication)
"""The component schemas these routes name (an upload's publication part in a body no model
states)."""


def openapi_paths() -> dict[str, Any]:
    return operations.described(OPERATIONS, {"$ref": REF + "Error"})


MODEL_NOTIFICATION = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid", "description": "the delivery id"},
        "type": {"type": "string", "enum": [e.type_name for e in NOTIFIED]},
        "tenant": {"type": "string"},
        "model": {"type": "string", "description": "the model's name"},
        "position": {"type": "integer", "description": "the event's place in the global log"},
        "version": {"type": "integer", "description": "the event's version in the model"},
        "at": {"type": "string", "format": "date-time"},
        "data": {"type": "object", "description": "the event's fields"},
    },
    "required": ["id", "type", "tenant", "model", "position", "version", "at", "data"],
}


def model_event_webhook(headers: list[dict[str, Any]]) -> dict[str, Any]:
    """The notification of a model's event, sent as a job's are (with `headers`)."""
    return {
        "post": {
            "summary": "A model's version or alias changed (sent to the URL its tenant set "
            "with PUT /v1/models/{name}/webhook)",
            "description": "Delivered, signed, retried and deduplicated exactly as jobEvent.",
            "parameters": headers,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": MODEL_NOTIFICATION}},
            },
            "responses": {"2XX": {"description": "received"}},
        }
    }


def answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def request_body(schema: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": {"$ref": REF + schema}}}}


def path_param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string"},
    }
