"""The OpenAPI description of inference jobs' routes (`controlplane.http.inference`); the
request schema comes from the pydantic model the handler validates."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane.http import params
from controlplane.http.deployment_paths import ACTING
from controlplane.http.model_paths import REF, answer, path_param, request_body
from controlplane.http.operations import links
from controlplane.http.streams import SSE_EVENT
from controlplane.inference.spec import InferenceRequest

SCHEMAS: tuple[type[BaseModel], ...] = (InferenceRequest,)
"""The component schemas these routes name."""

_REASONS = {
    400: "malformed request: a parameter or JSON body (the field names which)",
    401: "missing or wrong token",
    403: "a tenant's token acting for another tenant",
    404: "no such job (or none of the caller's), or not an inference job",
    409: "an Idempotency-Key used for another job",
    422: "invalid fields, each listed (the model reference, the input set, the image)",
    429: "over a tenant limit (queued jobs, submissions per second, live streams)",
}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): answer(_REASONS[s], {"$ref": REF + "Error"}) for s in statuses}


_JOB = path_param("job_id", "the inference job's id")
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "description": "a retry with the same key gets the job the first try made, never a second",
    "schema": params.text_schema(min_length=1, max_length=255),
}
_NUMBER = {"type": ["number", "null"]}
_JOB_VIEW = {"$ref": REF + "JobView"}
_COUNTS = {
    "type": "object",
    "description": "queries finished (succeeded or failed), running, queued (given back by a "
    "lost replica, to run again) and retried (run more than once; counted once)",
    "properties": {
        name: {"type": "integer"}
        for name in ("finished", "succeeded", "failed", "running", "queued", "retried")
    },
}
_FIGURES = {
    "queries": _COUNTS,
    "rate": {
        "type": "object",
        "properties": {
            "window_qps": {"type": "number", "description": "results in the last window_s"},
            "overall_qps": {"type": "number", "description": "results since the first query"},
        },
    },
    "latency_ms": {
        "type": ["object", "null"],
        "description": "each finished query's time, claimed to recorded, over every one (exact)",
        "properties": {
            name: _NUMBER for name in ("mean", "std", "min", "median", "p90", "p95", "p99", "max")
        },
    },
    "query_rate": {
        "type": ["object", "null"],
        "description": "IDunno's query rate: 1 / each finished query's time, in queries per "
        "second, over every one (exact)",
        "properties": {name: _NUMBER for name in ("mean", "std", "median", "p90", "p95", "p99")},
    },
}
_STATS = {
    "type": "object",
    "properties": {
        "job_id": {"type": "string", "format": "uuid"},
        "state": {"type": "string"},
        "model": {"type": "string", "description": "tenant/name:version, resolved at submission"},
        "weight": {"type": "number"},
        "batch_size": {"type": "integer"},
        "total_queries": {"type": ["integer", "null"], "description": "null: until cancelled"},
        "window_s": {"type": "number"},
        **_FIGURES,
        "replicas": {
            "type": "array",
            "description": "the replicas that asked for its queries, where, and their figures",
            "items": {
                "type": "object",
                "properties": {
                    "replica": {"type": "string", "format": "uuid"},
                    "node": {"type": "string"},
                    "seen_at": {"type": "string", "format": "date-time"},
                    **_FIGURES,
                },
            },
        },
    },
}
_QUERIES = {
    "type": "object",
    "properties": {
        "job_id": {"type": "string", "format": "uuid"},
        "next_after": {
            "type": ["integer", "null"],
            "description": "pass as `after` for more; null: this page is the last for now",
        },
        "queries": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "index": {"type": "integer"},
                    "state": {"type": "string"},
                    "replica": {"type": "string", "format": "uuid"},
                    "node": {"type": "string"},
                    "tries": {"type": "integer"},
                    "started_at": {"type": "string", "format": "date-time"},
                    "claimed_at": {"type": "string", "format": "date-time"},
                    "finished_at": {"type": ["string", "null"], "format": "date-time"},
                    "latency_ms": _NUMBER,
                    "inference_ms": _NUMBER,
                    "outputs": {"type": ["array", "null"], "description": "one per item"},
                    "error": {"type": ["string", "null"]},
                },
            },
        },
    },
}


def openapi_paths() -> dict[str, Any]:
    secured: list[dict[str, list[str]]] = [{"bearer": []}]
    return {
        "/v1/inference": {
            "post": {
                "operationId": "submitInference",
                "summary": "Submit an inference job: a model version over an input set, a query "
                "per batch, sharing replicas' time with other jobs by weight",
                "security": secured,
                "parameters": [ACTING, _IDEMPOTENCY_KEY],
                "requestBody": request_body("InferenceRequest"),
                "responses": {
                    "201": {
                        **answer(
                            "the job (read, stream and cancel it as a job)",
                            {"$ref": REF + "JobView"},
                        ),
                        "links": links(
                            "job_id",
                            "getJob",
                            "getJobHistory",
                            "getJobLogs",
                            "cancelJob",
                            "getInferenceStats",
                            "listInferenceQueries",
                        ),
                    },
                    **_errors(400, 401, 403, 409, 422, 429),
                },
            },
        },
        "/v1/jobs/{job_id}/stats": {
            "get": {
                "operationId": "getInferenceStats",
                "summary": "An inference job's statistics, exact, and each replica's",
                "security": secured,
                "parameters": [_JOB],
                "responses": {
                    "200": answer("the figures", _STATS),
                    **_errors(400, 401, 404),
                },
            },
        },
        "/v1/jobs/{job_id}/stats/events": {
            "get": {
                "operationId": "streamInferenceStats",
                "summary": "SSE: a `stats` event (the figures) now and at each change; ends "
                "once the job has ended",
                "security": secured,
                "parameters": [_JOB],
                "responses": {
                    "200": {
                        "description": "text/event-stream of `stats` events",
                        "content": {"text/event-stream": SSE_EVENT},
                    },
                    **_errors(400, 401, 404, 429),
                },
            },
        },
        "/v1/jobs/{job_id}/queries": {
            "get": {
                "operationId": "listInferenceQueries",
                "summary": "An inference job's queries and their results, in order",
                "security": secured,
                "parameters": [
                    _JOB,
                    {
                        "name": "after",
                        "in": "query",
                        "description": "queries with a greater index (default: from the first)",
                        "schema": {"type": "integer", "minimum": 0},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "description": "at most this many (default 100, at most 1000)",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                    },
                ],
                "responses": {
                    "200": answer("the queries", _QUERIES),
                    **_errors(400, 401, 404),
                },
            },
        },
    }
