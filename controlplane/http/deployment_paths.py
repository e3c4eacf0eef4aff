"""The OpenAPI description of serving's routes (`controlplane.http.deployments`); request
schemas come from the pydantic models the handlers validate."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane.deployments.spec import DeploymentRequest, PipelineRequest, ScaleRequest
from controlplane.http import params
from controlplane.http.deployments import PredictRequest
from controlplane.http.model_paths import REF, answer, path_param, request_body
from controlplane.http.streams import SSE_EVENT

SCHEMAS: tuple[type[BaseModel], ...] = (
    DeploymentRequest,
    ScaleRequest,
    PipelineRequest,
    PredictRequest,
)
"""The component schemas these routes name."""

_REASONS = {
    400: "malformed request: a parameter or JSON body (the field names which)",
    401: "missing or wrong token",
    403: "a tenant's token acting for another tenant",
    404: "no such deployment, pipeline or task (or none of the caller's)",
    409: "refused in the current state, or an Idempotency-Key used for another target (the "
    "message says which)",
    422: "invalid fields, each listed",
    429: "a tenant limit reached (deployments, replicas, CPUs, memory, queued predictions: the "
    "field names which; see docs/user-guide.md, Limits), or too many live streams; nothing written",
    503: "busy: the deployment kept changing under concurrent commands; retry",
}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): answer(_REASONS[s], {"$ref": REF + "Error"}) for s in statuses}


_NAME = path_param("name", "the deployment's (or pipeline's) name")
_TASK = path_param("task_id", "the task's id")
ACTING = {
    "name": "tenant",
    "in": "query",
    "description": "admins only: the tenant acted for",
    "schema": params.text_schema(),
}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "description": "a retry with the same key gets the task the first try made, never a second "
    "(409 if that one went to another deployment or pipeline)",
    "schema": params.text_schema(max_length=255),
}
_NUMBER = {"type": ["number", "null"]}
_QUANTILES = {
    "type": "object",
    "properties": {"p50": _NUMBER, "p99": _NUMBER},
    "required": ["p50", "p99"],
}
_DEPLOYMENT = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tenant": {"type": "string"},
        "model": {"type": "string", "description": "tenant/name:version, resolved at deploy"},
        "reference": {"type": "string", "description": "the model reference as given"},
        "version": {"type": "integer"},
        "artifact_sha256": {"type": "string"},
        "entry_point": {"type": "string"},
        "replicas": {"type": "integer", "description": "replicas asked for"},
        "resources": {"type": "object"},
        "serving": {"type": "object"},
        "state": {"type": "string", "enum": ["serving", "deleting"]},
        "inference_job": {
            "type": ["string", "null"],
            "format": "uuid",
            "description": "the inference job that owns it (its replicas run that job's "
            "queries; cancel the job to stop them)",
        },
        "replica_jobs": {
            "type": "array",
            "description": "the jobs serving it now (see GET /v1/jobs/{id})",
            "items": {
                "type": "object",
                "properties": {
                    "job_id": {"type": "string", "format": "uuid"},
                    "state": {"type": "string"},
                    "attempt": {"type": "integer"},
                },
                "required": ["job_id", "state", "attempt"],
            },
        },
        "failures": {
            "type": "integer",
            "description": "replicas retired in a row because their job FAILED",
        },
        "next_replica_at": {
            "type": ["string", "null"],
            "format": "date-time",
            "description": "after failures in a row, when a replica is started again (null: "
            "at once)",
        },
        "created_at": {"type": "string", "format": "date-time"},
        "updated_at": {"type": "string", "format": "date-time"},
    },
    "required": ["name", "tenant", "model", "replicas", "state", "replica_jobs"],
}
_DEPLOYMENTS = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "object"}}},
    "required": ["items"],
}
_TASK_VIEW = {
    "type": "object",
    "properties": {
        "task_id": {"type": "string", "format": "uuid"},
        "status": {"type": "string", "enum": ["queued", "running", "succeeded", "failed"]},
        "items": {"type": "integer"},
        "memo": {
            "type": "string",
            "enum": ["hit", "miss", "off"],
            "description": "hit: answered from the memo, without a replica; off: not memoized",
        },
        "tries": {"type": "integer"},
        "deployment": {"type": "string"},
        "pipeline": {"type": "string"},
        "step": {"type": "integer", "description": "a pipeline's step it is at (from 0)"},
        "outputs": {"type": "array", "description": "one per input item (succeeded only)"},
        "error": {"type": "string", "description": "why it failed: a traceback of the model's"},
        "submitted_at": {"type": "string", "format": "date-time"},
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
        "times": {
            "type": "object",
            "description": "DLHub's three times: request (submitted to finished), invocation "
            "(the agent's call of the replica, each step summed), inference (the model's own)",
            "properties": {
                "request_ms": _NUMBER,
                "invocation_ms": _NUMBER,
                "inference_ms": _NUMBER,
                "steps": {"type": "array", "items": {"type": "object"}},
            },
        },
    },
    "required": ["task_id", "status", "items"],
}
_PIPELINE = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tenant": {"type": "string"},
        "steps": {"type": "array", "items": {"type": "string"}},
        "created_at": {"type": "string", "format": "date-time"},
    },
    "required": ["name", "tenant", "steps"],
}
_FIGURES = {
    "type": "object",
    "description": "over the tasks and batches kept (24 hours)",
    "properties": {
        "deployment": {"type": "string"},
        "requests": {"type": "integer"},
        "succeeded": {"type": "integer"},
        "failed": {"type": "integer"},
        "queue_depth": {"type": "integer"},
        "running": {"type": "integer"},
        "memo": {"type": "object"},
        "latency_ms": _QUANTILES,
        "batches": {"type": "object"},
    },
    "required": ["deployment", "requests", "queue_depth", "memo", "latency_ms", "batches"],
}


def _predict(operation: str, summary: str) -> dict[str, Any]:
    secured: list[dict[str, list[str]]] = [{"bearer": []}]
    return {
        "post": {
            "operationId": operation,
            "summary": summary,
            "security": secured,
            "parameters": [_NAME, ACTING, _IDEMPOTENCY_KEY],
            "requestBody": request_body("PredictRequest"),
            "responses": {
                "200": answer("the finished task, with its outputs or error", _TASK_VIEW),
                "202": answer(
                    "queued (asked for, or not finished within 20 s): read it at Location",
                    _TASK_VIEW,
                ),
                **_errors(400, 401, 403, 404, 409, 422, 429),
            },
        }
    }


def openapi_paths() -> dict[str, Any]:
    secured: list[dict[str, list[str]]] = [{"bearer": []}]
    return {
        "/v1/deployments": {
            "post": {
                "operationId": "deploy",
                "summary": "Deploy a model version on replicas (jobs the agents run)",
                "security": secured,
                "parameters": [ACTING],
                "requestBody": request_body("DeploymentRequest"),
                "responses": {
                    "201": answer("the deployment", _DEPLOYMENT),
                    **_errors(400, 401, 403, 409, 422, 429, 503),
                },
            },
            "get": {
                "operationId": "listDeployments",
                "summary": "The tenant's deployments",
                "security": secured,
                "parameters": [ACTING],
                "responses": {
                    "200": answer("the deployments", _DEPLOYMENTS),
                    **_errors(400, 401, 403),
                },
            },
        },
        "/v1/deployments/{name}": {
            "get": {
                "operationId": "getDeployment",
                "summary": "A deployment and its replica jobs",
                "security": secured,
                "parameters": [_NAME, ACTING],
                "responses": {
                    "200": answer("the deployment", _DEPLOYMENT),
                    **_errors(400, 401, 403, 404),
                },
            },
            "patch": {
                "operationId": "scaleDeployment",
                "summary": "Change its number of replicas",
                "security": secured,
                "parameters": [_NAME, ACTING],
                "requestBody": request_body("ScaleRequest"),
                "responses": {
                    "200": answer("the deployment", _DEPLOYMENT),
                    **_errors(400, 401, 403, 404, 422, 429, 503),
                },
            },
            "delete": {
                "operationId": "undeploy",
                "summary": "Delete it: its replicas stop (queued tasks stay, unanswered)",
                "security": secured,
                "parameters": [_NAME, ACTING],
                "responses": {
                    "200": answer("the deployment, deleting", _DEPLOYMENT),
                    **_errors(400, 401, 403, 404, 503),
                },
            },
        },
        "/v1/deployments/{name}/predict": _predict(
            "predict", "Run the model on inputs (DLHub's run): synchronous or asynchronous"
        ),
        "/v1/deployments/{name}/metrics": {
            "get": {
                "operationId": "getDeploymentMetrics",
                "summary": "Requests, outcomes, queue depth, memo, batches and latencies",
                "security": secured,
                "parameters": [_NAME, ACTING],
                "responses": {
                    "200": answer("the figures", _FIGURES),
                    **_errors(400, 401, 403, 404),
                },
            }
        },
        "/v1/pipelines": {
            "post": {
                "operationId": "definePipeline",
                "summary": "Name a sequence of deployments: each step's outputs are the next "
                "step's inputs",
                "security": secured,
                "parameters": [ACTING],
                "requestBody": request_body("PipelineRequest"),
                "responses": {
                    "201": answer("the pipeline", _PIPELINE),
                    **_errors(400, 401, 403, 409, 422, 503),
                },
            }
        },
        "/v1/pipelines/{name}": {
            "get": {
                "operationId": "getPipeline",
                "summary": "A pipeline's steps",
                "security": secured,
                "parameters": [_NAME, ACTING],
                "responses": {
                    "200": answer("the pipeline", _PIPELINE),
                    **_errors(400, 401, 403, 404),
                },
            },
            "delete": {
                "operationId": "removePipeline",
                "summary": "Remove a pipeline (its deployments stay)",
                "security": secured,
                "parameters": [_NAME, ACTING],
                "responses": {
                    "204": {"description": "removed"},
                    **_errors(400, 401, 403, 404, 503),
                },
            },
        },
        "/v1/pipelines/{name}/predict": _predict(
            "predictPipeline", "Run a pipeline on inputs: one task through its steps"
        ),
        "/v1/tasks/{task_id}": {
            "get": {
                "operationId": "getTask",
                "summary": "A task: state, outputs or error, and its times",
                "security": secured,
                "parameters": [_TASK, ACTING],
                "responses": {
                    "200": answer("the task", _TASK_VIEW),
                    **_errors(400, 401, 403, 404),
                },
            }
        },
        "/v1/tasks/{task_id}/events": {
            "get": {
                "operationId": "streamTask",
                "summary": "SSE: a `status` event with the task now and at each change, until "
                "it has finished",
                "security": secured,
                "parameters": [_TASK, ACTING],
                "responses": {
                    "200": {
                        "description": "the stream",
                        "content": {"text/event-stream": SSE_EVENT},
                    },
                    **_errors(400, 401, 403, 404, 429),
                },
            }
        },
    }
