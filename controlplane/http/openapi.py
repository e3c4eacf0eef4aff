"""The OpenAPI document served at /openapi.json, made from every route's declaration (each
feature's `OPERATIONS`): the models its handler validates with and its facade answers with, so
the document cannot drift from what the code accepts and sends."""

from __future__ import annotations

from functools import cache
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from controlplane import __version__
from controlplane.http import (
    deployments,
    inference,
    jobs,
    log_search,
    logs,
    metrics,
    models,
    nodes,
    params,
    pending,
    probes,
    scheduling,
    scrape,
    searches,
    tenants,
    ui,
    webhooks,
)
from controlplane.http.notifications import WEBHOOKS
from controlplane.http.operations import (
    REF,
    Answer,
    Operation,
    add_operations,
    described,
    models_of,
)

ERROR = {
    "type": "object",
    "properties": {
        "error": {"type": "string"},
        "status": {"type": "integer"},
        "field": {"type": "string"},
        "fields": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "required": ["error", "status"],
}
"""What every refusal answers with (`controlplane.http.errors`)."""


async def serve(request: web.Request) -> web.Response:
    return web.json_response(document())


THIS = Operation(
    "get",
    "/openapi.json",
    serve,
    "openapi",
    "This document",
    {200: Answer("the OpenAPI document", {"type": "object"})},
    public=True,
)
OPERATIONS: tuple[Operation, ...] = (
    *probes.OPERATIONS,
    THIS,
    *jobs.OPERATIONS,
    *pending.OPERATIONS,
    *metrics.OPERATIONS,
    *logs.OPERATIONS,
    *log_search.OPERATIONS,
    *inference.OPERATIONS,
    *models.OPERATIONS,
    *deployments.OPERATIONS,
    *searches.OPERATIONS,
    *nodes.OPERATIONS,
    *scheduling.OPERATIONS,
    *tenants.OPERATIONS,
    *webhooks.OPERATIONS,
    *scrape.OPERATIONS,
    *ui.OPERATIONS,
)
"""Every route the server serves, feature by feature."""


def add_routes(app: web.Application) -> None:
    add_operations(app, [THIS])


@cache
def document() -> dict[str, Any]:
    paths = described(OPERATIONS, {"$ref": REF + "Error"})
    _with_body_limit(paths)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Trainyard", "version": __version__},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                **_schemas(*models_of(OPERATIONS)),
                "Error": ERROR,
                "StorableJson": STORABLE_JSON,
            },
        },
        "webhooks": WEBHOOKS,
        "paths": paths,
    }


def _schemas(*models: type[BaseModel]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=REF + "{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return {name: _storable(schema) for name, schema in schemas.items()}


STORABLE_JSON = {
    "description": "any JSON value whose text (strings and keys, at any depth) holds no NUL, "
    "which Postgres cannot store",
    "anyOf": [
        {"type": "string", "pattern": params.NO_NUL},
        {"type": ["number", "boolean", "null"]},
        {"type": "array", "items": {"$ref": REF + "StorableJson"}},
        {
            "type": "object",
            "propertyNames": {"pattern": params.NO_NUL},
            "additionalProperties": {"$ref": REF + "StorableJson"},
        },
    ],
}
"""What a list or map of any JSON (a task's inputs, an inference job's items) holds: what
`check_storable` admits."""


def _storable(schema: Any) -> Any:
    """The schema with what every request model checks stated: `check_storable` (text without
    NUL, which Postgres cannot hold) on each string and each map's keys that say nothing
    stricter (a pattern, a format, an enum or a constant), on the values of lists and maps of
    any JSON, and a map's key rule."""
    if isinstance(schema, list):
        return [_storable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    stated = {key: _storable(value) for key, value in schema.items()}
    free = not {"pattern", "format", "enum", "const"} & stated.keys()
    if schema.get("type") == "string" and free:
        stated["pattern"] = params.NO_NUL
    if schema.get("items") == {}:
        stated["items"] = {"$ref": REF + "StorableJson"}
    # A map of any JSON: pydantic writes its values as {} or true.
    if schema.get("additionalProperties") == {} or schema.get("additionalProperties") is True:
        stated["additionalProperties"] = {"$ref": REF + "StorableJson"}
    if isinstance(stated.get("additionalProperties"), dict):
        names = stated.get("propertyNames", {})
        if not {"pattern", "format", "enum", "const"} & names.keys():
            stated["propertyNames"] = {**names, "pattern": params.NO_NUL}
    # pydantic states a map's key rule as patternProperties alone: other keys are refused too.
    if "patternProperties" in schema and "additionalProperties" not in schema:
        stated["additionalProperties"] = False
    return stated


def _with_body_limit(paths: dict[str, Any]) -> None:
    """Each operation that reads a JSON body with its 413: `json_body` refuses one over the
    server's limit (aiohttp's client_max_size), whatever the schema says of its parts."""
    too_large = {
        "description": "the body is over the server's limit (1 MiB)",
        "content": {"application/json": {"schema": {"$ref": REF + "Error"}}},
    }
    for by_method in paths.values():
        for operation in by_method.values():
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                operation["responses"].setdefault("413", too_large)
