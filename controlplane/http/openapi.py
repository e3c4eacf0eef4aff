"""The OpenAPI document served at /openapi.json; schemas come from the pydantic models the
handlers validate with, so the document cannot drift from what the code accepts."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel

from controlplane import __version__
from controlplane.http import (
    deployment_paths,
    inference_paths,
    jobs,
    log_search,
    logs,
    metrics,
    model_paths,
    operations,
    params,
    pending_paths,
    probes,
    scrape,
    search_paths,
    tenants,
    ui,
)
from controlplane.http.operations import Answer, Operation, add_operations
from controlplane.jobs.lifecycle import Job
from controlplane.jobs.manifest import JobManifest, JobSubmission
from controlplane.tenants.limits import TenantLimits

REF = "#/components/schemas/"

_ERROR = {
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
_SECRETS = {
    "type": "object",
    "properties": {
        "tenant": {"type": "string"},
        "secrets": {
            "type": "array",
            "description": "the secrets deliveries are signed with now, the current one first",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "secret": {"type": "string"},
                    "created_at": {"type": "string", "format": "date-time"},
                    "valid_until": {
                        "type": ["string", "null"],
                        "format": "date-time",
                        "description": "null for the current secret; for a replaced one, the "
                        "end of its grace period",
                    },
                },
            },
        },
    },
}
_ISSUED_SECRET = {
    "type": "object",
    "properties": {
        "tenant": {"type": "string"},
        "id": {"type": "string"},
        "secret": {"type": "string"},
        "created_at": {"type": "string", "format": "date-time"},
        "previous_valid_until": {
            "type": ["string", "null"],
            "format": "date-time",
            "description": "until when the replaced secret signs deliveries too",
        },
    },
}
_NOTIFICATION = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid", "description": "the delivery id"},
        "type": {"type": "string", "enum": ["JobRestarted", "JobFailed", "JobCompleted"]},
        "job_id": {"type": "string", "format": "uuid"},
        "job_name": {"type": "string"},
        "tenant": {"type": "string"},
        "position": {"type": "integer", "description": "the event's place in the global log"},
        "version": {"type": "integer", "description": "the event's version in the job"},
        "at": {"type": "string", "format": "date-time"},
        "data": {"type": "object", "description": "the event's fields"},
    },
    "required": ["id", "type", "job_id", "job_name", "tenant", "position", "version", "at", "data"],
}


_GPU = {
    "type": "object",
    "properties": {
        "index": {"type": "integer"},
        "uuid": {"type": "string"},
        "model": {"type": "string"},
        "memory_mb": {"type": "integer"},
        "healthy": {"type": "boolean"},
        "health_reason": {"type": ["string", "null"]},
        "allocated": {"type": "boolean"},
        "job_id": {"type": ["string", "null"], "description": "admins only"},
        "attempt": {"type": ["integer", "null"], "description": "admins only"},
        "learner": {"type": ["integer", "null"], "description": "admins only"},
    },
}
_NODES = {
    "type": "object",
    "properties": {
        "nodes": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "state": {"type": "string", "enum": ["READY", "UNRESPONSIVE", "GONE", "LOST"]},
                    "runtime": {"type": "string"},
                    "lease_until": {"type": "string", "format": "date-time"},
                    "heartbeat_at": {"type": "string", "format": "date-time"},
                    "registered_at": {"type": "string", "format": "date-time"},
                    "cpus": {"type": "number"},
                    "cpus_allocated": {"type": "number"},
                    "memory_mb": {"type": "integer"},
                    "memory_mb_allocated": {"type": "integer"},
                    "gpus": {"type": "array", "items": _GPU},
                    "gpus_free": {"type": "integer"},
                    "gpus_allocated": {"type": "integer"},
                },
            },
        }
    },
}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF + name}


_REASONS = {
    400: "malformed request",
    401: "missing or wrong token",
    403: "not allowed for this token",
    404: "no such job (or another tenant's)",
    409: "illegal in the job's current state",
    422: "invalid fields, each listed",
    429: "a limit reached (see docs/user-guide.md, Limits); nothing written; Retry-After where "
    "waiting helps",
}


def _errors(*statuses: int, **reasons: str) -> dict[str, Any]:
    """Error responses; a keyword `e409="..."` overrides the default reason of a status."""
    return {str(s): _json(reasons.get(f"e{s}", _REASONS[s]), _ref("Error")) for s in statuses}


def _param(name: str, where: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": where, "description": description, "schema": schema}


_STRING = {"type": "string"}
_TENANT = _param("tenant", "query", "admins only: the tenant", params.text_schema())
_NOTIFICATION_HEADERS = [
    _param("Trainyard-Signature", "header", "the signature", _STRING),
    _param("Trainyard-Delivery-Id", "header", "dedupe on it", _STRING),
    _param("Trainyard-Event", "header", "the event's type", _STRING),
    _param("Trainyard-Attempt", "header", "from 1", {"type": "integer"}),
]


def _schemas(*models: type[BaseModel]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=REF + "{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return {name: _storable(schema) for name, schema in schemas.items()}


def _storable(schema: Any) -> Any:
    """The schema with what every request model checks stated: `check_storable` (text without
    NUL, which Postgres cannot hold) on each string and each map's keys that say nothing
    stricter (a pattern, a format, an enum or a constant), and a map's key rule."""
    if isinstance(schema, list):
        return [_storable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    stated = {key: _storable(value) for key, value in schema.items()}
    free = not {"pattern", "format", "enum", "const"} & stated.keys()
    if schema.get("type") == "string" and free:
        stated["pattern"] = params.NO_NUL
    if isinstance(schema.get("additionalProperties"), dict) and "propertyNames" not in schema:
        stated["propertyNames"] = {"pattern": params.NO_NUL}
    # pydantic states a map's key rule as patternProperties alone: other keys are refused too.
    if "patternProperties" in schema and "additionalProperties" not in schema:
        stated["additionalProperties"] = False
    return stated


def document() -> dict[str, Any]:
    secured: list[dict[str, list[str]]] = [{"bearer": []}]
    described: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Trainyard", "version": __version__},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                **_schemas(
                    JobManifest,
                    JobSubmission,
                    Job,
                    tenants.TenantCreate,
                    tenants.TenantUpdate,
                    TenantLimits,
                    tenants.TokenRequest,
                    *tenants.SCHEMAS,
                    *log_search.SCHEMAS,
                    *model_paths.SCHEMAS,
                    *deployment_paths.SCHEMAS,
                    *inference_paths.SCHEMAS,
                    *search_paths.SCHEMAS,
                    *ui.SCHEMAS,
                    *operations.models_of(OPERATIONS),
                ),
                "Error": _ERROR,
            },
        },
        "webhooks": {
            "jobEvent": {
                "post": {
                    "summary": "A job restarted, failed or completed (sent to its webhook_url)",
                    "description": "At least once: answer 2xx to acknowledge, and dedupe on "
                    "Trainyard-Delivery-Id. Anything else (or no answer within 10 s; redirects "
                    "are not followed) is retried with exponential backoff, up to 12 attempts; a "
                    "host resolving to a non-public address fails at once. "
                    "Verify Trainyard-Signature (t=<unix>,v1=<hex>[,v1=...]): HMAC-SHA256 with "
                    "the tenant's webhook secret of '<t>.' + the raw body; accept if any v1 "
                    "matches and t is recent.",
                    "parameters": _NOTIFICATION_HEADERS,
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _NOTIFICATION}},
                    },
                    "responses": {"2XX": {"description": "received"}},
                }
            },
            "modelEvent": model_paths.model_event_webhook(_NOTIFICATION_HEADERS),
        },
        "paths": {
            **operations.described(OPERATIONS, _ref("Error")),
            **deployment_paths.openapi_paths(),
            **inference_paths.openapi_paths(),
            **logs.openapi_paths(),
            **log_search.openapi_paths(),
            **metrics.openapi_paths(),
            **model_paths.openapi_paths(),
            **pending_paths.openapi_paths(),
            **search_paths.openapi_paths(),
            **scrape.openapi_paths(),
            **tenants.openapi_paths(),
            **ui.openapi_paths(),
            "/v1/nodes": {
                "get": {
                    "operationId": "listNodes",
                    "summary": "Nodes: state, lease, capacity, GPUs and their health",
                    "security": secured,
                    "responses": {"200": _json("the nodes", _NODES), **_errors(401)},
                }
            },
            "/v1/webhook-secret": {
                "get": {
                    "operationId": "getWebhookSecrets",
                    "summary": "The tenant's webhook signing secrets",
                    "security": secured,
                    "parameters": [_TENANT],
                    "responses": {
                        "200": _json("the secrets", _SECRETS),
                        **_errors(400, 401, 403, 404, e404="no secret issued yet"),
                    },
                },
                "post": {
                    "operationId": "rotateWebhookSecret",
                    "summary": "Issue a new webhook signing secret (rotate)",
                    "description": "The secret it replaces keeps signing deliveries too for "
                    "24 hours (one v1 per secret in Trainyard-Signature).",
                    "security": secured,
                    "parameters": [_TENANT],
                    "responses": {
                        "201": _json("the new secret", _ISSUED_SECRET),
                        **_errors(
                            400,
                            401,
                            403,
                            404,
                            409,
                            e404="no such tenant",
                            e409="the tenant kept changing; retry",
                        ),
                    },
                },
            },
        },
    }
    _with_body_limit(described["paths"])
    return described


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
OPERATIONS: tuple[Operation, ...] = (*probes.OPERATIONS, THIS, *jobs.OPERATIONS)
"""Every operation declared as an Operation; the rest are still described by hand below
(issue 33 moves each feature over)."""


def add_routes(app: web.Application) -> None:
    add_operations(app, [THIS])


def _with_body_limit(paths: dict[str, Any]) -> None:
    """Each operation that reads a JSON body with its 413: `json_body` refuses one over the
    server's limit (aiohttp's client_max_size), whatever the schema says of its parts."""
    for by_method in paths.values():
        for operation in by_method.values():
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                operation["responses"].setdefault(
                    "413", _json("the body is over the server's limit (1 MiB)", _ref("Error"))
                )
