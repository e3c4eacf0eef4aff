"""The OpenAPI description of a job's pending reasons (`controlplane.http.pending`)."""

from __future__ import annotations

from typing import Any

from controlplane.http.model_paths import REF, answer, path_param
from controlplane.http.streams import SSE_EVENT
from controlplane.pending.reasons import Blocking, Reason

_REASONS = {
    400: "malformed request: a parameter (the field names which)",
    401: "missing or wrong token",
    404: "no such job (or none of the caller's)",
    429: "over the tenant's live streams",
}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): answer(_REASONS[s], {"$ref": REF + "Error"}) for s in statuses}


_JOB = path_param("job_id", "the job's id")
_TIME = {"type": ["string", "null"], "format": "date-time"}
_REASON = {
    "type": "string",
    "enum": [r.value for r in Reason],
    "description": "no_nodes (no node is READY), unschedulable (no live node could ever hold "
    "it), gpu_unhealthy (one would, were its GPUs healthy), quota (its tenant's GPU quota; "
    "`never` when the job alone exceeds it), backoff (a restart's backoff), resources (no "
    "READY node has room now: the detail names what is short), fair_share (jobs of other "
    "tenants come first), priority (its tenant's jobs of higher priority come first), "
    "starting (nothing holds it: the next claim takes it), replicas (an inference job waiting "
    "for its replicas)",
}
_BLOCKING = {
    "type": "string",
    "enum": [b.value for b in Blocking],
    "description": "never: it will not run as it is (the cluster, the job or the quota must "
    "change); waiting: it waits for its turn, for room, or for a backoff's end",
}
_NOW = {
    "job_id": {"type": "string"},
    "state": {"type": "string"},
    "attempt": {"type": "integer"},
    "position": {
        "type": ["integer", "null"],
        "description": "its place in the queue, 1 first, in the claims' order (fair share, "
        "priority, submission); null unless QUEUED",
    },
    "reasons": {
        "type": "array",
        "description": "every reason holding it now (none unless QUEUED); at least one while it is",
        "items": {
            "type": "object",
            "properties": {
                "reason": _REASON,
                "blocking": _BLOCKING,
                "detail": {"type": "string"},
                "since": {**_TIME, "description": "when this reason began to hold it"},
            },
        },
    },
    "estimated_start": {
        **_TIME,
        "description": "when it should start, as the running jobs give their room back at "
        "their expected ends (the median run time of their tenant's recent COMPLETED jobs of "
        "the same name); null when it can start now, or when an end it waits for is unknown",
    },
    "updated_at": {**_TIME, "description": "when the recorder last changed these reasons"},
}
_VIEW = {
    "type": "object",
    "properties": {
        **_NOW,
        "history": {
            "type": "array",
            "description": "every span a reason held the job, oldest first, every attempt",
            "items": {
                "type": "object",
                "properties": {
                    "attempt": {"type": "integer"},
                    "reason": _REASON,
                    "blocking": _BLOCKING,
                    "detail": {"type": "string", "description": "what it said when it began"},
                    "from": _TIME,
                    "until": {**_TIME, "description": "null while it still holds"},
                    "seconds": {"type": "number"},
                },
            },
        },
        "seconds": {
            "type": "object",
            "description": "each reason's time holding the job within [since, until]",
            "additionalProperties": {"type": "number"},
        },
    },
}


def openapi_paths() -> dict[str, Any]:
    window = [
        {
            "name": name,
            "in": "query",
            "description": f"`seconds` counts from this instant (RFC 3339) {what}",
            "schema": {"type": "string", "format": "date-time"},
        }
        for name, what in (("since", "on (default: the first)"), ("until", "back (default: now)"))
    ]
    return {
        "/v1/jobs/{job_id}/pending": {
            "get": {
                "operationId": "getJobPending",
                "summary": "Why the job is pending: every reason now, its queue position, and "
                "the history of its reasons with the time each held it",
                "security": [{"bearer": []}],
                "parameters": [_JOB, *window],
                "responses": {
                    "200": answer("the job's pending reasons", _VIEW),
                    **_errors(400, 401, 404),
                },
            }
        },
        "/v1/jobs/{job_id}/pending/events": {
            "get": {
                "operationId": "streamJobPending",
                "summary": "SSE: a `pending` event (reasons, position, state) now and at each "
                "change; ends once the job has ended",
                "security": [{"bearer": []}],
                "parameters": [_JOB],
                "responses": {
                    "200": {
                        "description": "text/event-stream of `pending` events",
                        "content": {"text/event-stream": SSE_EVENT},
                    },
                    **_errors(400, 401, 404, 429),
                },
            }
        },
    }
