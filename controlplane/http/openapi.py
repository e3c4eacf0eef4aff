"""The OpenAPI document served at /openapi.json; schemas come from the pydantic models the
handlers validate with, so the document cannot drift from what the code accepts."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane import __version__
from controlplane.http import (
    deployment_paths,
    inference_paths,
    log_search,
    logs,
    metrics,
    model_paths,
    params,
    pending_paths,
    scrape,
    search_paths,
    tenants,
    ui,
)
from controlplane.http.jobs import MAX_PAGE, CancelRequest
from controlplane.http.requests import MAX_KEY
from controlplane.http.streams import SSE_EVENT
from controlplane.jobs.lifecycle import Job, JobStatus
from controlplane.jobs.manifest import JobManifest, JobSubmission
from controlplane.tenants.limits import TenantLimits

REF = "#/components/schemas/"

_HEALTH = {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}
_READY = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ready", "not ready"]},
        "database": {"type": "boolean"},
        "projections_caught_up": {"type": "boolean"},
        "background_tasks": {"type": "boolean"},
        "stopped_projections": {
            "type": "object",
            "description": "projections stopped on an event they failed on too many times in a "
            "row, by name: what stopped each",
            "additionalProperties": {"type": "string"},
        },
    },
    "required": [
        "status",
        "database",
        "projections_caught_up",
        "background_tasks",
        "stopped_projections",
    ],
}
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
_JOB_LIST = {
    "type": "object",
    "properties": {
        "jobs": {"type": "array", "items": {"$ref": REF + "JobView"}},
        "next_cursor": {"type": ["string", "null"]},
        "total": {
            "type": "integer",
            "description": "how many jobs the filters match in all (every page says it)",
        },
    },
    "required": ["jobs", "next_cursor", "total"],
}
_HISTORY = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "history": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "version": {"type": "integer"},
                    "position": {"type": "integer"},
                    "event": {"type": "string"},
                    "state": {"type": "string"},
                    "attempt": {"type": "integer"},
                    "at": {"type": "string", "format": "date-time"},
                    "actor": {"type": "string"},
                    "reason": {"type": ["string", "null"]},
                },
            },
        },
        "webhooks": {
            "type": "array",
            "description": "every attempt to deliver the job's notifications, in the order "
            "they ended (from the stream webhook-<job_id>)",
            "items": {
                "type": "object",
                "properties": {
                    "version": {"type": "integer"},
                    "position": {"type": "integer"},
                    "event": {
                        "type": "string",
                        "enum": ["WebhookDelivered", "WebhookAttemptFailed", "WebhookFailed"],
                        "description": "delivered (2xx); failed and retried at retry_at; "
                        "failed on the last attempt (given up)",
                    },
                    "delivery_id": {"type": "string", "format": "uuid"},
                    "job_event": {"type": "string"},
                    "job_event_position": {"type": "integer"},
                    "attempt": {"type": "integer"},
                    "started_at": {"type": "string", "format": "date-time"},
                    "at": {"type": "string", "format": "date-time"},
                    "status": {"type": ["integer", "null"]},
                    "error": {"type": "string"},
                    "retry_at": {"type": "string", "format": "date-time"},
                },
            },
        },
    },
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


_JOB_OPERATIONS = (
    "getJob",
    "getJobHistory",
    "getJobLogs",
    "getJobMetrics",
    "cancelJob",
    "checkpointJob",
)
"""What can be done with a job a response names: its OpenAPI links (clients, and generated
tests, follow them from a submission to the job's reads, cancellation and checkpoint)."""


def _job(description: str) -> dict[str, Any]:
    """A response with the job's view, linked to the operations on that job."""
    return {
        **_json(description, _ref("JobView")),
        "links": model_paths.links("job_id", *_JOB_OPERATIONS),
    }


def _errors(*statuses: int, **reasons: str) -> dict[str, Any]:
    """Error responses; a keyword `e409="..."` overrides the default reason of a status."""
    return {str(s): _json(reasons.get(f"e{s}", _REASONS[s]), _ref("Error")) for s in statuses}


def _job_view_schema() -> dict[str, Any]:
    """What `job_view` sends: the Job with its `job_id` as `id`."""
    schema = Job.model_json_schema(ref_template=REF + "{model}")
    schema.pop("$defs", None)
    properties = {
        "id": {"type": "string", "format": "uuid"},
        **schema["properties"],
        "unschedulable_reason": {
            "type": ["string", "null"],
            "description": "why a queued job can never fit on any live node as they stand",
        },
    }
    del properties["job_id"]
    required = [
        "id",
        *(name for name in schema["required"] if name != "job_id"),
        "unschedulable_reason",
    ]
    return {**schema, "title": "JobView", "properties": properties, "required": required}


def _param(name: str, where: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": where, "description": description, "schema": schema}


_JOB_ID = {**_param("job_id", "path", "the job's id", {"type": "string"}), "required": True}
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
                    CancelRequest,
                    tenants.TenantCreate,
                    tenants.TenantUpdate,
                    TenantLimits,
                    tenants.TokenRequest,
                    *model_paths.SCHEMAS,
                    *deployment_paths.SCHEMAS,
                    *inference_paths.SCHEMAS,
                    *search_paths.SCHEMAS,
                ),
                "JobView": _job_view_schema(),
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
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "summary": "Liveness: the process serves requests",
                    "responses": {"200": _json("alive", _HEALTH)},
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "summary": "Readiness: the database answers and projections have caught up",
                    "responses": {
                        "200": _json("ready", _READY),
                        "503": _json("not ready", _READY),
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document",
                    "responses": {"200": _json("the OpenAPI document", {"type": "object"})},
                }
            },
            "/v1/jobs": {
                "post": {
                    "operationId": "submitJob",
                    "summary": "Submit a job (committed before the 201)",
                    "security": secured,
                    "parameters": [
                        _param(
                            "Idempotency-Key",
                            "header",
                            "retries with the same key return the same job",
                            params.text_schema(min_length=1, max_length=MAX_KEY),
                        ),
                        _param(
                            "tenant",
                            "query",
                            "admins only: the tenant to submit as",
                            params.text_schema(),
                        ),
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("JobSubmission")}},
                    },
                    "responses": {
                        "201": _job("the job (also for an idempotent retry)"),
                        **_errors(
                            400,
                            401,
                            403,
                            409,
                            422,
                            429,
                            e409="the Idempotency-Key was used for a different manifest",
                            e422="invalid manifest fields, each listed (a reserved environment "
                            "name as `env.NAME`; memory_mb also past the largest node's); an "
                            "image the service does not allow (`image`); a file:// data.source "
                            "or results.location outside the operator's roots for the tenant "
                            "(the field names it); an unknown tenant; or a webhook_url whose "
                            "host is or resolves to a non-public address (not in "
                            "TRAINYARD_WEBHOOK_ALLOW_NETWORKS) or does not resolve",
                            e429="the tenant's submissions_per_s (with Retry-After) or "
                            "queued_jobs limit reached (field names which)",
                        ),
                    },
                },
                "get": {
                    "operationId": "listJobs",
                    "summary": "List jobs, newest first",
                    "security": secured,
                    "parameters": [
                        _param(
                            "state",
                            "query",
                            "repeatable: only jobs in these states",
                            {"type": "string", "enum": list(JobStatus.__members__)},
                        ),
                        _param(
                            "label",
                            "query",
                            "repeatable KEY=VALUE: only jobs with these labels",
                            params.label_filter_schema(2 * MAX_KEY),
                        ),
                        _param(
                            "limit",
                            "query",
                            "page size (default 50)",
                            params.schema(minimum=1, maximum=MAX_PAGE),
                        ),
                        _param(
                            "cursor",
                            "query",
                            "next_cursor of the previous page",
                            params.CURSOR_SCHEMA,
                        ),
                    ],
                    "responses": {"200": _json("a page of jobs", _JOB_LIST), **_errors(400, 401)},
                },
            },
            "/v1/jobs/{job_id}": {
                "get": {
                    "operationId": "getJob",
                    "summary": "A job's status, now or as of a past instant",
                    "security": secured,
                    "parameters": [
                        _JOB_ID,
                        _param(
                            "as_of",
                            "query",
                            "RFC 3339 instant",
                            {"type": "string", "format": "date-time"},
                        ),
                    ],
                    "responses": {
                        "200": _job("the job"),
                        **_errors(400, 401, 404),
                    },
                }
            },
            "/v1/jobs/{job_id}/history": {
                "get": {
                    "operationId": "getJobHistory",
                    "summary": "Every event of the job with its time, actor and reason, and "
                    "every attempt to deliver its webhook notifications",
                    "security": secured,
                    "parameters": [_JOB_ID],
                    "responses": {"200": _json("the history", _HISTORY), **_errors(401, 404)},
                }
            },
            "/v1/jobs/{job_id}/events": {
                "get": {
                    "operationId": "streamJobEvents",
                    "summary": "Server-sent events of the job; ends after a terminal state",
                    "description": "Each SSE `id` is the event's global position; send it back as "
                    "`Last-Event-ID` to resume exactly after it. A comment heartbeat is sent "
                    "while idle.",
                    "security": secured,
                    "parameters": [
                        _JOB_ID,
                        _param(
                            "Last-Event-ID",
                            "header",
                            "resume after this position",
                            params.POSITION_SCHEMA,
                        ),
                        _param("after", "query", "same as Last-Event-ID", params.POSITION_SCHEMA),
                    ],
                    "responses": {
                        "200": {
                            "description": "the event stream",
                            "content": {"text/event-stream": SSE_EVENT},
                        },
                        **_errors(
                            400,
                            401,
                            404,
                            429,
                            e429="the tenant's live streams limit, or the server's, reached; "
                            "Retry-After",
                        ),
                    },
                }
            },
            "/v1/jobs/{job_id}/cancel": {
                "post": {
                    "operationId": "cancelJob",
                    "summary": "Cancel the job",
                    "security": secured,
                    "parameters": [_JOB_ID],
                    "requestBody": {
                        "content": {"application/json": {"schema": _ref("CancelRequest")}}
                    },
                    "responses": {
                        "200": _job("the cancelled job"),
                        **_errors(400, 401, 404, 409, 422),
                    },
                }
            },
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
            "/v1/jobs/{job_id}/checkpoint": {
                "post": {
                    "operationId": "checkpointJob",
                    "summary": "Ask the job's learners for a checkpoint now (PROCESSING jobs)",
                    "description": "One request is pending at a time: until the learners have "
                    "saved the checkpoint (or the attempt ends), another is a 409.",
                    "security": secured,
                    "parameters": [_JOB_ID],
                    "responses": {
                        "202": _job("the request is recorded"),
                        **_errors(
                            401,
                            404,
                            409,
                            e409="not PROCESSING, or a checkpoint request is pending already",
                        ),
                    },
                }
            },
        },
    }
    _with_body_limit(described["paths"])
    return described


def _with_body_limit(paths: dict[str, Any]) -> None:
    """Each operation that reads a JSON body with its 413: `json_body` refuses one over the
    server's limit (aiohttp's client_max_size), whatever the schema says of its parts."""
    for operations in paths.values():
        for operation in operations.values():
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                operation["responses"].setdefault(
                    "413", _json("the body is over the server's limit (1 MiB)", _ref("Error"))
                )
