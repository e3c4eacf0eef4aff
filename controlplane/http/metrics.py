"""`GET /v1/jobs/{job_id}/metrics`: the training metrics the job's learners reported."""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from controlplane.http.auth import principal
from controlplane.http.jobs import visible_job
from controlplane.http.keys import POOL
from controlplane.logs.metrics import MetricPoint, read_metrics


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/jobs/{job_id}/metrics", get_metrics)


async def get_metrics(request: web.Request) -> web.Response:
    job = await visible_job(request, principal(request))
    points = await read_metrics(request.app[POOL], job.job_id)
    return web.json_response({"id": str(job.job_id), "metrics": [_view(p) for p in points]})


def _view(point: MetricPoint) -> dict[str, Any]:
    return {
        "attempt": point.attempt,
        "learner": point.learner,
        "step": point.step,
        "at": point.at.isoformat(),
        # JSON has no NaN or infinity (a diverging loss): they are sent as strings.
        "values": {k: v if math.isfinite(v) else str(v) for k, v in point.values.items()},
    }


def openapi_paths() -> dict[str, Any]:
    point = {
        "type": "object",
        "properties": {
            "attempt": {"type": "integer"},
            "learner": {"type": "integer"},
            "step": {"type": "integer"},
            "at": {"type": "string", "format": "date-time"},
            "values": {
                "type": "object",
                "additionalProperties": {"type": ["number", "string"]},
            },
        },
    }
    return {
        "/v1/jobs/{job_id}/metrics": {
            "get": {
                "operationId": "getJobMetrics",
                "summary": "The job's training metrics, as its learners reported them",
                "security": [{"bearer": []}],
                "parameters": [
                    {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {
                        "description": "every metric report, in the order stored",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "id": {"type": "string"},
                                        "metrics": {"type": "array", "items": point},
                                    },
                                }
                            }
                        },
                    },
                    "401": {"description": "missing or wrong token"},
                    "404": {"description": "no such job (or another tenant's)"},
                },
            }
        }
    }
