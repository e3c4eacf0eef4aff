"""The notifications Trainyard sends (OpenAPI's `webhooks`): a job's events to its
`webhook_url`, a model's to the URL its tenant set. They are requests the server makes, not
routes it serves, so they are described here rather than declared as Operations."""

from __future__ import annotations

from typing import Any

from controlplane.models.events import NOTIFIED

_HEADERS = [
    {"name": name, "in": "header", "description": description, "schema": schema}
    for name, description, schema in (
        ("Trainyard-Signature", "the signature", {"type": "string"}),
        ("Trainyard-Delivery-Id", "dedupe on it", {"type": "string"}),
        ("Trainyard-Event", "the event's type", {"type": "string"}),
        ("Trainyard-Attempt", "from 1", {"type": "integer"}),
    )
]
_COMMON = {
    "id": {"type": "string", "format": "uuid", "description": "the delivery id"},
    "tenant": {"type": "string"},
    "position": {"type": "integer", "description": "the event's place in the global log"},
    "at": {"type": "string", "format": "date-time"},
    "data": {"type": "object", "description": "the event's fields"},
}
_JOB_NOTIFICATION = {
    "type": "object",
    "properties": {
        **_COMMON,
        "type": {"type": "string", "enum": ["JobRestarted", "JobFailed", "JobCompleted"]},
        "job_id": {"type": "string", "format": "uuid"},
        "job_name": {"type": "string"},
        "version": {"type": "integer", "description": "the event's version in the job"},
    },
    "required": ["id", "type", "job_id", "job_name", "tenant", "position", "version", "at", "data"],
}
_MODEL_NOTIFICATION = {
    "type": "object",
    "properties": {
        **_COMMON,
        "type": {"type": "string", "enum": [e.type_name for e in NOTIFIED]},
        "model": {"type": "string", "description": "the model's name"},
        "version": {"type": "integer", "description": "the event's version in the model"},
    },
    "required": ["id", "type", "tenant", "model", "position", "version", "at", "data"],
}


def _sent(summary: str, description: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "description": description,
            "parameters": _HEADERS,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"2XX": {"description": "received"}},
        }
    }


WEBHOOKS = {
    "jobEvent": _sent(
        "A job restarted, failed or completed (sent to its webhook_url)",
        "At least once: answer 2xx to acknowledge, and dedupe on Trainyard-Delivery-Id. "
        "Anything else (or no answer within 10 s; redirects are not followed) is retried with "
        "exponential backoff, up to 12 attempts; a host resolving to a non-public address fails "
        "at once. Verify Trainyard-Signature (t=<unix>,v1=<hex>[,v1=...]): HMAC-SHA256 with the "
        "tenant's webhook secret of '<t>.' + the raw body; accept if any v1 matches and t is "
        "recent.",
        _JOB_NOTIFICATION,
    ),
    "modelEvent": _sent(
        "A model's version or alias changed (sent to the URL its tenant set with "
        "PUT /v1/models/{name}/webhook)",
        "Delivered, signed, retried and deduplicated exactly as jobEvent.",
        _MODEL_NOTIFICATION,
    ),
}
"""OpenAPI's `webhooks` object."""
