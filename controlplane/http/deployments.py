"""`/v1/deployments`, `/v1/pipelines` and `/v1/tasks`: model serving over HTTP. Deploy a model
version on replicas, scale, delete; predict synchronously (the result in the response) or
asynchronously (202 and a task to read or stream); a deployment's figures.

`?tenant=NAME` names the tenant acted for (an admin's requests); a tenant's deployments,
pipelines and tasks are invisible to every other tenant (404).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any
from uuid import UUID

import asyncpg
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane.admission import gate
from controlplane.admission.policy import replica_room
from controlplane.deployments.errors import Conflict, InvalidRequest, NotFound, ServingError
from controlplane.deployments.lifecycle import Busy, Deployment, Pipeline
from controlplane.deployments.names import NAME
from controlplane.deployments.reconcile import next_start
from controlplane.deployments.spec import DeploymentRequest, PipelineRequest, ScaleRequest
from controlplane.deployments.tasks import (
    MAX_ITEMS,
    IdempotencyMismatch,
    Target,
    new_task_id,
    task_view,
)
from controlplane.deployments.views import figures as deployment_figures
from controlplane.deployments.views import list_deployments as listed
from controlplane.deployments.views import replica_states
from controlplane.http import params
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.errors import error
from controlplane.http.keys import DEPLOYMENTS, IMAGES, POOL, SSE_HEARTBEAT_S, TASKS
from controlplane.http.requests import MAX_KEY, actor, json_body, validated
from controlplane.http.streams import SSE_HEADERS, live_stream
from controlplane.instruments import SERVING_LATENCY, SERVING_REQUESTS, sse_client
from controlplane.jobs.images import ImageRefused

SYNC_WAIT_S = 20.0
"""How long a synchronous prediction waits for its result before it is answered 202 (the task
goes on; its Location says where to read it): under the SDK's request timeout (30 s), which
then waits for the task."""


class PredictRequest(BaseModel):
    """POST .../predict: the items for the entry point (one call takes a list of them)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    inputs: list[Any] = Field(
        min_length=1, max_length=MAX_ITEMS, description="the items, each one input"
    )
    asynchronous: bool = Field(
        default=False,
        alias="async",
        description="answer 202 with the task at once, instead of waiting for the result",
    )
    no_cache: bool = Field(
        default=False, description="run the model even if the memo has this input's result"
    )


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/deployments", deploy)
    app.router.add_get("/v1/deployments", list_deployments)
    app.router.add_get("/v1/deployments/{name}", get_deployment)
    app.router.add_patch("/v1/deployments/{name}", scale)
    app.router.add_delete("/v1/deployments/{name}", undeploy)
    app.router.add_post("/v1/deployments/{name}/predict", predict)
    app.router.add_get("/v1/deployments/{name}/metrics", figures)
    app.router.add_post("/v1/pipelines", define_pipeline)
    app.router.add_get("/v1/pipelines/{name}", get_pipeline)
    app.router.add_delete("/v1/pipelines/{name}", remove_pipeline)
    app.router.add_post("/v1/pipelines/{name}/predict", predict_pipeline)
    app.router.add_get("/v1/tasks/{task_id}", get_task)
    app.router.add_get("/v1/tasks/{task_id}/events", stream_task)


def refused(exc: ServingError) -> web.HTTPException:
    if isinstance(exc, InvalidRequest):
        return error(422, str(exc), field=exc.field)
    if isinstance(exc, NotFound):
        return error(404, str(exc))
    if isinstance(exc, Busy):
        return error(503, str(exc), retry_after_s=1)
    if isinstance(exc, Conflict):
        return error(409, str(exc))
    return error(409, str(exc))


def _tenant(request: web.Request, action: str) -> str:
    requested = params.text(request.query.get("tenant"), "tenant")
    return acting_tenant(principal(request), requested, action)


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not NAME.fullmatch(name):
        raise error(404, f"no such deployment or pipeline {name[:80]!r}")
    return name


def deployment_view(
    deployment: Deployment, replicas: list[asyncpg.Record] | None = None
) -> dict[str, Any]:
    states = {r["job_id"]: r for r in replicas or []}
    waiting = next_start(deployment)
    return {
        "name": deployment.name,
        "tenant": deployment.tenant,
        "model": f"{deployment.model_tenant}/{deployment.model_name}:{deployment.version}",
        "reference": deployment.reference,
        "version": deployment.version,
        "artifact_sha256": deployment.artifact_sha256,
        "entry_point": deployment.entry_point,
        "replicas": deployment.replicas,
        "resources": deployment.resources,
        "serving": deployment.serving,
        "state": "deleting" if deployment.deleted else "serving",
        "replica_jobs": [
            {
                "job_id": str(job_id),
                "state": states[job_id]["state"] if job_id in states else "QUEUED",
                "attempt": states[job_id]["attempt"] if job_id in states else 1,
            }
            for job_id in deployment.active
        ],
        "failures": deployment.failures,
        "inference_job": None
        if deployment.inference_job is None
        else str(deployment.inference_job),
        "next_replica_at": None if waiting is None else waiting.isoformat(),
        "created_at": deployment.created_at.isoformat(),
        "updated_at": deployment.updated_at.isoformat(),
    }


async def _view(request: web.Request, deployment: Deployment) -> dict[str, Any]:
    rows = await replica_states(request.app[POOL], deployment.active)
    return deployment_view(deployment, rows)


async def _load(request: web.Request, tenant: str, name: str) -> Deployment:
    deployment = await request.app[DEPLOYMENTS].load(tenant, name)
    if deployment is None:
        raise error(404, f"no deployment {name}")
    return deployment


async def deploy(request: web.Request) -> web.Response:
    """Deploy a model version: 201 with the deployment, its replica jobs asked for."""
    tenant = _tenant(request, "deploys")
    body = validated(DeploymentRequest, await json_body(request))
    try:
        # Refused here, as a job's is: a replica's node would refuse it at every start.
        request.app[IMAGES].admit(body.resources.image)
    except ImageRefused as exc:
        raise error(422, str(exc), field="resources.image") from exc
    asked = replica_room(body.replicas, body.resources.cpus, body.resources.memory_mb)
    await gate.admit(request.app[POOL], tenant, replace(asked, deployments=1))
    try:
        deployment = await request.app[DEPLOYMENTS].deploy(tenant, body, actor(principal(request)))
    except ServingError as exc:
        raise refused(exc) from exc
    headers = {"Location": f"/v1/deployments/{deployment.name}"}
    return web.json_response(await _view(request, deployment), status=201, headers=headers)


async def list_deployments(request: web.Request) -> web.Response:
    tenant = _tenant(request, "lists deployments")
    rows = await listed(request.app[POOL], tenant)
    items = [
        {
            "name": r["name"],
            "model": f"{r['model_tenant']}/{r['model_name']}:{r['version']}",
            "replicas": r["replicas"],
            "replica_jobs": len(r["replica_jobs"]),
            "state": "deleting" if r["deleted"] else "serving",
            "created_at": r["created_at"].isoformat(),
        }
        for r in rows
    ]
    return web.json_response({"items": items})


async def get_deployment(request: web.Request) -> web.Response:
    tenant = _tenant(request, "reads deployments")
    deployment = await _load(request, tenant, _name(request))
    return web.json_response(await _view(request, deployment))


async def scale(request: web.Request) -> web.Response:
    tenant = _tenant(request, "scales deployments")
    name = _name(request)
    body = validated(ScaleRequest, await json_body(request))
    current = await _load(request, tenant, name)
    more = body.replicas - current.replicas
    if more > 0:
        resources = current.resources
        await gate.admit(
            request.app[POOL], tenant, replica_room(more, resources["cpus"], resources["memory_mb"])
        )
    try:
        deployment = await request.app[DEPLOYMENTS].scale(
            tenant, name, body.replicas, actor(principal(request))
        )
    except ServingError as exc:
        raise refused(exc) from exc
    return web.json_response(await _view(request, deployment))


async def undeploy(request: web.Request) -> web.Response:
    tenant = _tenant(request, "deletes deployments")
    name = _name(request)
    try:
        deployment = await request.app[DEPLOYMENTS].delete(tenant, name, actor(principal(request)))
    except ServingError as exc:
        raise refused(exc) from exc
    return web.json_response(await _view(request, deployment))


async def _deployment_target(request: web.Request, tenant: str, name: str) -> Target:
    # From the stream, not the read model: a deployment deleted a moment ago takes no task.
    deployment = await _load(request, tenant, name)
    if deployment.deleted:
        raise error(404, f"no deployment {name}")
    salt = None
    if deployment.serving["memo"]:
        salt = f"{deployment.artifact_sha256}\n{deployment.entry_point}"
    return Target(tenant=tenant, steps=(name,), memo_salt=salt)


async def predict(request: web.Request) -> web.Response:
    """Run the deployment's model on `inputs`: 200 with the outputs (the memo's, or a
    replica's); 202 with the task when asked to (`async`) or when the result takes longer than
    the synchronous wait."""
    tenant = _tenant(request, "predicts")
    body = validated(PredictRequest, await json_body(request))
    target = await _deployment_target(request, tenant, _name(request))
    return await _run(request, target, body)


async def predict_pipeline(request: web.Request) -> web.Response:
    """Run a pipeline: one task through its deployments in order."""
    tenant = _tenant(request, "predicts")
    name = _name(request)
    body = validated(PredictRequest, await json_body(request))
    pipeline = await request.app[DEPLOYMENTS].pipeline(tenant, name)
    if pipeline is None:
        raise error(404, f"no pipeline {name}")
    target = Target(tenant=tenant, steps=pipeline.steps, pipeline=name)
    return await _run(request, target, body)


async def _run(request: web.Request, target: Target, body: PredictRequest) -> web.Response:
    arrived = time.perf_counter()
    await gate.admit_predictions(request.app[POOL], target.tenant, len(body.inputs))
    tasks = request.app[TASKS]
    labels = {"tenant": target.tenant, "deployment": target.pipeline or target.steps[0]}
    key = params.text(request.headers.get("Idempotency-Key"), "Idempotency-Key", max_length=MAX_KEY)
    queued = new_task_id(target.tenant, key)
    location = {"Location": f"/v1/tasks/{queued}"}
    # Expected before it is queued: its result cannot come before this request listens.
    with tasks.expecting(queued) as finished:
        try:
            answered = await tasks.answer_or_queue(
                target, queued, body.inputs, no_cache=body.no_cache, idempotency_key=key
            )
        except IdempotencyMismatch as exc:
            raise error(409, str(exc), field="Idempotency-Key") from exc
        except ValueError as exc:  # NaN, infinity, NUL or a lone surrogate: not storable JSON
            raise error(422, f"inputs: {exc}", field="inputs") from exc
        memo = "off" if target.memo_salt is None or body.no_cache else "miss"
        SERVING_REQUESTS.add(1, {**labels, "memo": "hit" if answered is not None else memo})
        if answered is None and not body.asynchronous:
            answered = await tasks.wait(finished, SYNC_WAIT_S)
    if answered is None:
        view = {"task_id": str(queued), "status": "queued", "items": len(body.inputs)}
        return web.json_response(view, status=202, headers=location)
    SERVING_LATENCY.record(time.perf_counter() - arrived, labels)
    return web.json_response(task_view(answered), headers=location)


async def figures(request: web.Request) -> web.Response:
    """The deployment's figures, over the tasks and batches kept: requests, outcomes, queue
    depth, memo hits and misses, batch sizes and why batches left, latencies."""
    tenant = _tenant(request, "reads deployments")
    name = _name(request)
    await _load(request, tenant, name)
    row = await deployment_figures(request.app[POOL], tenant, name)
    if row is None:
        raise error(404, f"no deployment {name}")

    def quantiles(values: list[float] | None) -> dict[str, float | None]:
        p50, p99 = values or (None, None)
        return {"p50": p50, "p99": p99}

    batches = row["batches"]
    return web.json_response(
        {
            "deployment": name,
            "requests": row["requests"],
            "succeeded": row["succeeded"],
            "failed": row["failed"],
            "queue_depth": row["queue_depth"],
            "running": row["running"],
            "memo": {
                "hits": row["memo_hits"],
                "misses": row["memo_misses"],
                "entries": row["memo_entries"],
            },
            "latency_ms": quantiles(row["latency_ms"]),
            "batches": {
                "count": batches,
                "items": row["items"],
                "mean_size": row["items"] / batches if batches else None,
                "max_size": row["max_items"],
                "full": row["full"],
                "timeout": row["timeout"],
                "invocation_ms": quantiles(row["invocation_ms"]),
                "inference_ms": quantiles(row["inference_ms"]),
            },
        }
    )


def pipeline_view(pipeline: Pipeline) -> dict[str, Any]:
    return {
        "name": pipeline.name,
        "tenant": pipeline.tenant,
        "steps": list(pipeline.steps),
        "created_at": pipeline.created_at.isoformat(),
    }


async def define_pipeline(request: web.Request) -> web.Response:
    tenant = _tenant(request, "defines pipelines")
    body = validated(PipelineRequest, await json_body(request))
    try:
        pipeline = await request.app[DEPLOYMENTS].define_pipeline(
            tenant, body, actor(principal(request))
        )
    except ServingError as exc:
        raise refused(exc) from exc
    headers = {"Location": f"/v1/pipelines/{pipeline.name}"}
    return web.json_response(pipeline_view(pipeline), status=201, headers=headers)


async def get_pipeline(request: web.Request) -> web.Response:
    tenant = _tenant(request, "reads pipelines")
    name = _name(request)
    pipeline = await request.app[DEPLOYMENTS].pipeline(tenant, name)
    if pipeline is None:
        raise error(404, f"no pipeline {name}")
    return web.json_response(pipeline_view(pipeline))


async def remove_pipeline(request: web.Request) -> web.Response:
    tenant = _tenant(request, "removes pipelines")
    name = _name(request)
    try:
        await request.app[DEPLOYMENTS].remove_pipeline(tenant, name, actor(principal(request)))
    except ServingError as exc:
        raise refused(exc) from exc
    return web.Response(status=204)


async def _task(request: web.Request) -> tuple[str, UUID, asyncpg.Record]:
    tenant = _tenant(request, "reads tasks")
    task_id = params.uuid(request.match_info["task_id"], "task_id", status=404)
    row = await request.app[TASKS].get(tenant, task_id)
    if row is None:
        raise error(404, f"no task {task_id}")
    return tenant, task_id, row


async def get_task(request: web.Request) -> web.Response:
    """A task: its state, its outputs or error, and its times (request, invocation, inference,
    and each step's)."""
    _, _, row = await _task(request)
    return web.json_response(task_view(row))


async def stream_task(request: web.Request) -> web.StreamResponse:
    """SSE of a task: a `status` event now and at each change; the stream ends once the task
    has finished (a `status` event with its outputs or error); a comment heartbeat while idle."""
    tenant, task_id, row = await _task(request)
    response = web.StreamResponse(headers=SSE_HEADERS)
    with await live_stream(request):
        await response.prepare(request)
        try:
            with sse_client("tasks"):
                await _follow_task(request, response, tenant, task_id, row)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away; the task is unaffected (its record stays)
    return response


async def _follow_task(
    request: web.Request,
    response: web.StreamResponse,
    tenant: str,
    task_id: UUID,
    row: asyncpg.Record,
) -> None:
    tasks = request.app[TASKS]
    sent = None
    while True:
        view = task_view(row)
        if view["status"] != sent:
            sent = view["status"]
            await response.write(f"event: status\ndata: {json.dumps(view)}\n\n".encode())
        if sent in ("succeeded", "failed") or tasks.stopping:
            break
        with tasks.expecting(task_id) as finished:
            # Read once listening: a change in between is in the row, or delivered after.
            latest = await tasks.get(tenant, task_id)
            row = row if latest is None else latest
            if row["state"] == sent:
                done = await tasks.wait(finished, request.app[SSE_HEARTBEAT_S])
                if done is None:
                    await response.write(b": heartbeat\n\n")
                else:
                    row = done
