"""`/v1/deployments`, `/v1/pipelines` and `/v1/tasks`: model serving over HTTP. Deploy a model
version on replicas, scale, delete; predict synchronously (the result in the response) or
asynchronously (202 and a task to read or stream), or stream a streaming model's outputs (SSE,
`/predict/stream`); a deployment's figures.

`?tenant=NAME` names the tenant acted for (an admin's requests); a tenant's deployments,
pipelines and tasks are invisible to every other tenant (404). The handlers route and
authenticate; serving's facade (`controlplane.deployments.application`) decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from controlplane.agent_port.gone_clients import CLIENT_GONE, unless_gone
from controlplane.deployments.application import (
    HISTORY_PAGE,
    MAX_HISTORY_PAGE,
    ServingApplication,
    named,
)
from controlplane.deployments.inputs_text import sent_inputs
from controlplane.deployments.lifecycle import Busy
from controlplane.deployments.spec import (
    Autoscaling,
    CanaryRequest,
    DeploymentRequest,
    PipelineRequest,
    PredictRequest,
    ScaleRequest,
)
from controlplane.deployments.streaming import (
    NoChannel,
    PredictionStreams,
    StreamEvent,
    StreamRequest,
)
from controlplane.deployments.views import (
    DeploymentFigures,
    DeploymentHistory,
    DeploymentList,
    DeploymentView,
    PipelineView,
    QueuedTask,
    TaskView,
)
from controlplane.http import params, query
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.errors import error
from controlplane.http.keys import IMAGES, PLANE, SSE_HEARTBEAT_S
from controlplane.http.operations import Answer, Handler, Operation, Param, add_operations
from controlplane.http.requests import MAX_KEY, actor, idempotency_param, json_body, validated
from controlplane.http.streams import SSE_EVENT, SSE_HEADERS, live_stream
from controlplane.instruments import sse_client

SERVING_APPLICATION = web.AppKey("serving_application", ServingApplication)
PREDICTION_STREAMS = web.AppKey("prediction_streams", PredictionStreams)
NO_CHANNEL_RETRY_S = 1.0


class ActingQuery(query.Query):
    tenant: Annotated[str | None, query.text()] = Field(
        default=None, description="admins only: the tenant acted for"
    )


def acting(request: web.Request, action: str) -> str:
    """The tenant the request acts for (`?tenant=`, an admin's); `action` completes the
    messages of its refusals."""
    return acting_tenant(principal(request), query.parsed(request, ActingQuery).tenant, action)


def answer(
    body: BaseModel, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(
        body.model_dump(mode="json", by_alias=True), status=status, headers=headers
    )


def retried_when_busy(handler: Handler) -> Handler:
    """`handler`, a `Busy` deployment answered 503 with Retry-After: no refusal's kind says
    "the same request may pass in a moment", which is what it means."""

    @functools.wraps(handler)
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except Busy as exc:
            raise error(503, str(exc), retry_after_s=1) from exc

    return handle


def _name(request: web.Request) -> str:
    return named(request.match_info["name"])


async def deploy(request: web.Request) -> web.Response:
    tenant = acting(request, "deploys")
    body = validated(DeploymentRequest, await json_body(request))
    view = await request.app[SERVING_APPLICATION].deploy(tenant, body, actor(principal(request)))
    return answer(view, status=201, headers={"Location": f"/v1/deployments/{view.name}"})


async def list_deployments(request: web.Request) -> web.Response:
    tenant = acting(request, "lists deployments")
    return answer(await request.app[SERVING_APPLICATION].listed(tenant))


async def get_deployment(request: web.Request) -> web.Response:
    tenant = acting(request, "reads deployments")
    return answer(await request.app[SERVING_APPLICATION].deployment(tenant, _name(request)))


class HistoryQuery(ActingQuery):
    after: Annotated[int, query.integer(0, 2**31 - 1)] = Field(
        default=0, description="events after this version of the deployment (a page's `next_after`)"
    )
    limit: Annotated[int, query.integer(1, MAX_HISTORY_PAGE)] = Field(
        default=HISTORY_PAGE,
        description=f"events in the page (default {HISTORY_PAGE}, at most {MAX_HISTORY_PAGE})",
    )


async def get_history(request: web.Request) -> web.Response:
    tenant = acting(request, "reads deployments")
    page = query.parsed(request, HistoryQuery)
    history = request.app[SERVING_APPLICATION].history(
        tenant, _name(request), after=page.after, limit=page.limit
    )
    return answer(await history)


async def scale(request: web.Request) -> web.Response:
    tenant = acting(request, "scales deployments")
    name = _name(request)
    body = validated(ScaleRequest, await json_body(request))
    who = actor(principal(request))
    return answer(await request.app[SERVING_APPLICATION].scale(tenant, name, body, who))


async def set_autoscaling(request: web.Request) -> web.Response:
    tenant = acting(request, "scales deployments")
    name = _name(request)
    body = validated(Autoscaling, await json_body(request))
    who = actor(principal(request))
    facade = request.app[SERVING_APPLICATION]
    return answer(await facade.set_autoscaling(tenant, name, body, who))


async def set_canary(request: web.Request) -> web.Response:
    tenant = acting(request, "deploys")
    name = _name(request)
    body = validated(CanaryRequest, await json_body(request))
    who = actor(principal(request))
    facade = request.app[SERVING_APPLICATION]
    return answer(await facade.start_canary(tenant, name, body, who))


async def promote_canary(request: web.Request) -> web.Response:
    tenant = acting(request, "deploys")
    who = actor(principal(request))
    facade = request.app[SERVING_APPLICATION]
    return answer(await facade.promote_canary(tenant, _name(request), who))


async def roll_back_canary(request: web.Request) -> web.Response:
    tenant = acting(request, "deploys")
    who = actor(principal(request))
    facade = request.app[SERVING_APPLICATION]
    return answer(await facade.roll_back_canary(tenant, _name(request), who))


async def stop_autoscaling(request: web.Request) -> web.Response:
    tenant = acting(request, "scales deployments")
    name = _name(request)
    who = actor(principal(request))
    facade = request.app[SERVING_APPLICATION]
    return answer(await facade.set_autoscaling(tenant, name, None, who))


async def undeploy(request: web.Request) -> web.Response:
    tenant = acting(request, "deletes deployments")
    name = _name(request)
    who = actor(principal(request))
    return answer(await request.app[SERVING_APPLICATION].undeploy(tenant, name, who))


async def predict(request: web.Request) -> web.Response:
    tenant = acting(request, "predicts")
    document = await json_body(request)
    body = _prediction(document)
    name = _name(request)
    key = _prediction_key(request)
    serving = request.app[SERVING_APPLICATION]
    if body.asynchronous:  # answered once queued: nothing holds a replica for it
        return _task_answer(await serving.predict(tenant, name, body, key))
    # The body's text, read already (aiohttp keeps it): the direct path sends the inputs' own.
    sent = sent_inputs(await request.text(), document)
    task = await unless_gone(request, serving.predict(tenant, name, body, key, sent))
    return web.Response(status=CLIENT_GONE) if task is None else _task_answer(task)


async def predict_stream(request: web.Request) -> web.StreamResponse:
    """SSE of a streaming model's outputs on one item: an `output` event per output as the
    model yields it, then `done` (the task's id, its number of outputs and times) or `error`;
    a comment heartbeat while the model is quiet. Not resumable: a client that goes away
    stops the model at its next output (controlplane/deployments/streaming.py)."""
    tenant = acting(request, "predicts")
    body = validated(StreamRequest, await json_body(request))
    name = _name(request)
    streams = request.app[PREDICTION_STREAMS]
    with await live_stream(request):
        try:
            stream = await streams.open(tenant, name, body)
        except NoChannel as exc:
            raise error(503, str(exc), retry_after_s=NO_CHANNEL_RETRY_S) from exc
        response = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await response.prepare(request)
            with sse_client("predictions"):
                events = stream.events(request.app[SSE_HEARTBEAT_S])
                async with contextlib.aclosing(events):
                    sent = await unless_gone(request, _send(events, response, stream.progress_s))
            if sent is not None:
                await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away: its stream is closed, and not counted
        except TimeoutError:
            # The client took nothing for the deployment's task timeout: its stream is closed
            # (the agent stops the model), not counted, and its connection dropped (what is
            # left to write could not be written either).
            if request.transport is not None:
                request.transport.abort()
        finally:
            await stream.aclose()
    return response


async def _send(
    events: AsyncIterator[StreamEvent | None], response: web.StreamResponse, progress_s: float
) -> bool:
    """Each event written; TimeoutError when one waits `progress_s` for the client to take it
    (a client that stopped reading would hold the stream, and its replica, for good)."""
    async for event in events:
        text = b": heartbeat\n\n" if event is None else _sse(event)
        async with asyncio.timeout(progress_s):
            await response.write(text)
    return True


def _sse(event: StreamEvent) -> bytes:
    return f"event: {event.kind}\ndata: {event.data}\n\n".encode()


async def predict_pipeline(request: web.Request) -> web.Response:
    tenant = acting(request, "predicts")
    name = _name(request)
    body = _prediction(await json_body(request))
    key = _prediction_key(request)
    serving = request.app[SERVING_APPLICATION]
    return _task_answer(await serving.predict_pipeline(tenant, name, body, key))


def _prediction(document: Any) -> PredictRequest:
    """`document` as a PredictRequest, as `validated` reads it, without the second parse
    `validated` makes (the body encoded again and read in JSON mode): on every prediction's
    path, the items' text is the most of it. Its fields (a list of anything, booleans) take
    in Python's strict mode exactly what they take in JSON's; a refusal is `validated`'s, for
    its messages in JSON's words ("an object", "an array")."""
    try:
        return PredictRequest.model_validate(document, strict=True)
    except ValidationError:
        return validated(PredictRequest, document)


def _prediction_key(request: web.Request) -> str | None:
    # Any text, even empty, as predictions have always taken it (jobs' keys are 1 to 255).
    return params.text(
        request.headers.get("Idempotency-Key"), "Idempotency-Key", max_length=MAX_KEY
    )


def _task_answer(task: TaskView | QueuedTask) -> web.Response:
    headers = {"Location": f"/v1/tasks/{task.task_id}"}
    # Pydantic's own JSON writer, not `answer`'s dump then json.dumps: on every prediction's
    # path, it writes the same JSON (compactly) in about a third of their time.
    return web.Response(
        text=task.model_dump_json(by_alias=True),
        status=202 if isinstance(task, QueuedTask) else 200,
        headers=headers,
        content_type="application/json",
    )


async def figures(request: web.Request) -> web.Response:
    tenant = acting(request, "reads deployments")
    return answer(await request.app[SERVING_APPLICATION].figures(tenant, _name(request)))


async def define_pipeline(request: web.Request) -> web.Response:
    tenant = acting(request, "defines pipelines")
    body = validated(PipelineRequest, await json_body(request))
    serving = request.app[SERVING_APPLICATION]
    view = await serving.define_pipeline(tenant, body, actor(principal(request)))
    return answer(view, status=201, headers={"Location": f"/v1/pipelines/{view.name}"})


async def get_pipeline(request: web.Request) -> web.Response:
    tenant = acting(request, "reads pipelines")
    return answer(await request.app[SERVING_APPLICATION].pipeline(tenant, _name(request)))


async def remove_pipeline(request: web.Request) -> web.Response:
    tenant = acting(request, "removes pipelines")
    name = _name(request)
    await request.app[SERVING_APPLICATION].remove_pipeline(tenant, name, actor(principal(request)))
    return web.Response(status=204)


async def get_task(request: web.Request) -> web.Response:
    tenant = acting(request, "reads tasks")
    task_id = request.match_info["task_id"]
    return answer(await request.app[SERVING_APPLICATION].task(tenant, task_id))


async def cancel_task(request: web.Request) -> web.Response:
    tenant = acting(request, "cancels tasks")
    task_id = request.match_info["task_id"]
    return answer(await request.app[SERVING_APPLICATION].cancel_task(tenant, task_id))


async def stream_task(request: web.Request) -> web.StreamResponse:
    """SSE of a task: a `status` event now and at each change; the stream ends once the task
    has finished (a `status` event with its outputs or error); a comment heartbeat while idle."""
    tenant = acting(request, "reads tasks")
    serving = request.app[SERVING_APPLICATION]
    task = await serving.task(tenant, request.match_info["task_id"])
    changes = serving.changes(tenant, task, request.app[SSE_HEARTBEAT_S])
    response = web.StreamResponse(headers=SSE_HEADERS)
    with await live_stream(request):
        await response.prepare(request)
        try:
            with sse_client("tasks"):
                async with contextlib.aclosing(changes):
                    async for change in changes:
                        await response.write(_event(change))
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away; the task is unaffected (its record stays)
    return response


def _event(task: TaskView | None) -> bytes:
    if task is None:
        return b": heartbeat\n\n"
    data = json.dumps(task.model_dump(mode="json", by_alias=True))
    return f"event: status\ndata: {data}\n\n".encode()


MALFORMED = "malformed request: a parameter or JSON body (the field names which)"
UNAUTHORIZED = "missing or wrong token"
FORBIDDEN = "a tenant's token acting for another tenant"
FORBIDDEN_OR_BEYOND = (
    f"{FORBIDDEN}; or a request that alone asks for more than its tenant may hold at all (the "
    "field names the limit)"
)
NOT_FOUND = "no such deployment, pipeline or task (or none of the caller's)"
CONFLICT = (
    "refused in the current state, or an Idempotency-Key used for another target (the message "
    "says which)"
)
INVALID = "invalid fields, each listed"
LIMITED = (
    "a tenant limit reached (deployments, replicas, CPUs, memory, queued predictions: the field "
    "names which; see docs/user-guide.md, Limits), or too many live streams; nothing written"
)
BUSY = "busy: the deployment kept changing under concurrent commands; retry"
NAME = Param("name", "path", "the deployment's (or pipeline's) name", {"type": "string"})
TASK_ID = Param("task_id", "path", "the task's id", {"type": "string"})
PREDICTION_KEY = idempotency_param(
    "a retry with the same key gets the task the first try made, never a second (409 if that "
    "one went to another deployment or pipeline)"
)
CHANGE_REFUSALS = {
    400: MALFORMED,
    401: UNAUTHORIZED,
    403: FORBIDDEN,
    404: NOT_FOUND,
    409: CONFLICT,
    503: BUSY,
}
"""What a change to a deployment that takes no body may be refused with."""


def _predict(handler: Handler, id: str, summary: str) -> Operation:
    path = "/v1/deployments/{name}/predict" if id == "predict" else "/v1/pipelines/{name}/predict"
    return Operation(
        "post",
        path,
        handler,
        id,
        summary,
        {
            200: Answer("the finished task, with its outputs or error", TaskView),
            202: Answer(
                "queued (asked for, or not finished within 20 s): read it at Location", QueuedTask
            ),
        },
        {
            400: MALFORMED,
            401: UNAUTHORIZED,
            403: FORBIDDEN_OR_BEYOND,
            404: NOT_FOUND,
            409: CONFLICT,
            422: INVALID,
            429: LIMITED,
        },
        query=ActingQuery,
        params=(NAME, PREDICTION_KEY),
        body=PredictRequest,
        body_required=True,
    )


OPERATIONS = (
    Operation(
        "post",
        "/v1/deployments",
        retried_when_busy(deploy),
        "deploy",
        "Deploy a model version on replicas (jobs the agents run)",
        {201: Answer("the deployment", DeploymentView)},
        {
            400: MALFORMED,
            401: UNAUTHORIZED,
            403: FORBIDDEN_OR_BEYOND,
            404: "no such model, version or alias (or none the caller may see): the field "
            "`model` names it",
            409: CONFLICT,
            422: INVALID,
            429: LIMITED,
            503: BUSY,
        },
        query=ActingQuery,
        body=DeploymentRequest,
        body_required=True,
    ),
    Operation(
        "get",
        "/v1/deployments",
        list_deployments,
        "listDeployments",
        "The tenant's deployments",
        {200: Answer("the deployments", DeploymentList)},
        {400: MALFORMED, 401: UNAUTHORIZED, 403: FORBIDDEN},
        query=ActingQuery,
    ),
    Operation(
        "get",
        "/v1/deployments/{name}",
        get_deployment,
        "getDeployment",
        "A deployment and its replica jobs",
        {200: Answer("the deployment", DeploymentView)},
        {400: MALFORMED, 401: UNAUTHORIZED, 403: FORBIDDEN, 404: NOT_FOUND},
        query=ActingQuery,
        params=(NAME,),
    ),
    Operation(
        "get",
        "/v1/deployments/{name}/history",
        get_history,
        "getDeploymentHistory",
        "Every event of the deployment, with its time and actor: its replicas' changes (its "
        "owner's, or its autoscaling's with the load that drove each), started and retired; "
        "in pages, oldest first",
        {200: Answer("a page of the history", DeploymentHistory)},
        {400: MALFORMED, 401: UNAUTHORIZED, 403: FORBIDDEN, 404: NOT_FOUND},
        query=HistoryQuery,
        params=(NAME,),
    ),
    Operation(
        "patch",
        "/v1/deployments/{name}",
        retried_when_busy(scale),
        "scaleDeployment",
        "Change its number of replicas",
        {200: Answer("the deployment", DeploymentView)},
        {
            400: MALFORMED,
            401: UNAUTHORIZED,
            403: FORBIDDEN_OR_BEYOND,
            404: NOT_FOUND,
            409: "it is autoscaled: its load sets its replicas",
            422: INVALID,
            429: LIMITED,
            503: BUSY,
        },
        query=ActingQuery,
        params=(NAME,),
        body=ScaleRequest,
        body_required=True,
    ),
    Operation(
        "put",
        "/v1/deployments/{name}/autoscaling",
        retried_when_busy(set_autoscaling),
        "setDeploymentAutoscaling",
        "Its replicas follow its load within these bounds from the next sweep (autoscaling "
        "turned on, or its bounds changed)",
        {200: Answer("the deployment", DeploymentView)},
        {
            400: MALFORMED,
            401: UNAUTHORIZED,
            403: FORBIDDEN_OR_BEYOND,
            404: NOT_FOUND,
            409: CONFLICT,
            422: INVALID,
            429: LIMITED,
            503: BUSY,
        },
        query=ActingQuery,
        params=(NAME,),
        body=Autoscaling,
        body_required=True,
    ),
    Operation(
        "put",
        "/v1/deployments/{name}/canary",
        retried_when_busy(set_canary),
        "setDeploymentCanary",
        "Another version of its model beside it, taking `weight` percent of its requests "
        "(synchronous and asynchronous; a pipeline's steps go to each deployment's own "
        "version) on replicas of its own; again, its weight moves. With `rollback`, the "
        "controller rolls it back by itself once its error rate passes the limit",
        {200: Answer("the deployment, with its canary", DeploymentView)},
        {
            400: MALFORMED,
            401: UNAUTHORIZED,
            403: FORBIDDEN_OR_BEYOND,
            404: NOT_FOUND,
            409: CONFLICT,
            422: INVALID,
            429: LIMITED,
            503: BUSY,
        },
        query=ActingQuery,
        params=(NAME,),
        body=CanaryRequest,
        body_required=True,
    ),
    Operation(
        "post",
        "/v1/deployments/{name}/canary/promote",
        retried_when_busy(promote_canary),
        "promoteDeploymentCanary",
        "Its canary's version becomes its own: the canary's replicas serve every request, "
        "the old version's are stopped, and more are started up to its replicas",
        {200: Answer("the deployment", DeploymentView)},
        CHANGE_REFUSALS,
        query=ActingQuery,
        params=(NAME,),
    ),
    Operation(
        "delete",
        "/v1/deployments/{name}/canary",
        retried_when_busy(roll_back_canary),
        "rollBackDeploymentCanary",
        "Its canary rolled back: its replicas stopped, every request to its own version",
        {200: Answer("the deployment", DeploymentView)},
        CHANGE_REFUSALS,
        query=ActingQuery,
        params=(NAME,),
    ),
    Operation(
        "delete",
        "/v1/deployments/{name}/autoscaling",
        retried_when_busy(stop_autoscaling),
        "stopDeploymentAutoscaling",
        "Its autoscaling off: its replicas stay what they are now, a fixed number",
        {200: Answer("the deployment", DeploymentView)},
        CHANGE_REFUSALS,
        query=ActingQuery,
        params=(NAME,),
    ),
    Operation(
        "delete",
        "/v1/deployments/{name}",
        retried_when_busy(undeploy),
        "undeploy",
        "Delete it: its replicas stop (queued tasks stay, unanswered)",
        {200: Answer("the deployment, deleting", DeploymentView)},
        {400: MALFORMED, 401: UNAUTHORIZED, 403: FORBIDDEN, 404: NOT_FOUND, 503: BUSY},
        query=ActingQuery,
        params=(NAME,),
    ),
    _predict(
        predict, "predict", "Run the model on inputs (DLHub's run): synchronous or asynchronous"
    ),
    Operation(
        "post",
        "/v1/deployments/{name}/predict/stream",
        predict_stream,
        "predictStream",
        "Stream a streaming model's outputs on one item (SSE), as the model yields them",
        {
            200: Answer(
                "text/event-stream: an `output` event per output (its data the output's JSON), "
                "in the order yielded, each sent as it is yielded; then `done` (`task_id`, "
                "`chunks`: the outputs sent, `times`: request, first output, invocation, "
                "inference ms) or `error` (`task_id`, `chunks`, `error`: the model's traceback, "
                "an output not storable as JSON, the replica lost, no output within the "
                "deployment's task_timeout_s, outputs past 64 MiB, the control plane shutting "
                "down), the last event; a `: heartbeat` comment while the model is quiet. Not "
                "resumable (no event ids): a client that goes away stops the model at its next "
                "output, and its request is no task. Never batched with other requests, never "
                "memoized; counted as a task (GET /v1/tasks/{id}: its outputs, one item's, the "
                "list of all it yielded)",
                SSE_EVENT["schema"],
                media="text/event-stream",
            )
        },
        {
            400: MALFORMED,
            401: UNAUTHORIZED,
            403: FORBIDDEN,
            404: NOT_FOUND,
            409: "the deployment's model does not stream: its entry point is not a generator "
            "function (predict without streaming)",
            422: f"{INVALID}: `inputs` holds exactly one item, one the model version takes",
            429: LIMITED,
            503: "no replica can take a stream now (a stream needs a replica offered on its "
            "agent's serving channel: none started yet, scaled to zero, or agents run with "
            "--serving-listen off); retry after Retry-After, or predict without streaming",
        },
        query=ActingQuery,
        params=(NAME,),
        body=StreamRequest,
        body_required=True,
    ),
    Operation(
        "get",
        "/v1/deployments/{name}/metrics",
        figures,
        "getDeploymentMetrics",
        "Requests, outcomes, queue depth, memo, batches and latencies",
        {200: Answer("the figures", DeploymentFigures)},
        {400: MALFORMED, 401: UNAUTHORIZED, 403: FORBIDDEN, 404: NOT_FOUND},
        query=ActingQuery,
        params=(NAME,),
    ),
    Operation(
        "post",
        "/v1/pipelines",
        retried_when_busy(define_pipeline),
        "definePipeline",
        "Name a sequence of deployments: each step's outputs are the next step's inputs",
        {201: Answer("the pipeline", PipelineView)},
        {
            400: MALFORMED,
            401: UNAUTHORIZED,
            403: FORBIDDEN,
            404: "a step names no deployment of the tenant (the field `steps.N` says which)",
            409: CONFLICT,
            422: INVALID,
            503: BUSY,
        },
        query=ActingQuery,
        body=PipelineRequest,
        body_required=True,
    ),
    Operation(
        "get",
        "/v1/pipelines/{name}",
        get_pipeline,
        "getPipeline",
        "A pipeline's steps",
        {200: Answer("the pipeline", PipelineView)},
        {400: MALFORMED, 401: UNAUTHORIZED, 403: FORBIDDEN, 404: NOT_FOUND},
        query=ActingQuery,
        params=(NAME,),
    ),
    Operation(
        "delete",
        "/v1/pipelines/{name}",
        retried_when_busy(remove_pipeline),
        "removePipeline",
        "Remove a pipeline (its deployments stay)",
        {204: Answer("removed")},
        {400: MALFORMED, 401: UNAUTHORIZED, 403: FORBIDDEN, 404: NOT_FOUND, 503: BUSY},
        query=ActingQuery,
        params=(NAME,),
    ),
    _predict(
        predict_pipeline, "predictPipeline", "Run a pipeline on inputs: one task through its steps"
    ),
    Operation(
        "get",
        "/v1/tasks/{task_id}",
        get_task,
        "getTask",
        "A task: state, outputs or error, and its times",
        {200: Answer("the task", TaskView)},
        {400: MALFORMED, 401: UNAUTHORIZED, 403: FORBIDDEN, 404: NOT_FOUND},
        query=ActingQuery,
        params=(TASK_ID,),
    ),
    Operation(
        "post",
        "/v1/tasks/{task_id}/cancel",
        cancel_task,
        "cancelTask",
        "Cancel a task not yet finished: it fails, `cancelled by its owner`. Queued, no replica "
        "takes it; running, its replica finishes the call it is in (never interrupted) and the "
        "result is not recorded",
        {200: Answer("the task, failed as cancelled", TaskView)},
        {
            400: MALFORMED,
            401: UNAUTHORIZED,
            403: FORBIDDEN,
            404: NOT_FOUND,
            409: "the task has already finished (succeeded, failed or cancelled)",
        },
        query=ActingQuery,
        params=(TASK_ID,),
    ),
    Operation(
        "get",
        "/v1/tasks/{task_id}/events",
        stream_task,
        "streamTask",
        "SSE: a `status` event with the task now and at each change, until it has finished",
        {200: Answer("the stream", SSE_EVENT["schema"], media="text/event-stream")},
        {400: MALFORMED, 401: UNAUTHORIZED, 403: FORBIDDEN_OR_BEYOND, 404: NOT_FOUND, 429: LIMITED},
        query=ActingQuery,
        params=(TASK_ID,),
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
    app.on_startup.append(_open)
    app.on_shutdown.append(_stop_streams)


async def _open(app: web.Application) -> None:
    # After the composition root's parts are open (cleanup contexts start first).
    plane = app[PLANE]
    serving = app[SERVING_APPLICATION] = ServingApplication(
        plane.deployments,
        plane.tasks,
        plane.pool,
        images=app[IMAGES],
        direct=plane.direct,
        counting=plane.counting,
    )
    app[PREDICTION_STREAMS] = PredictionStreams(serving, plane.direct, plane.counting)


async def _stop_streams(app: web.Application) -> None:
    # A graceful shutdown ends the open prediction streams (each with its `error`, counted)
    # before it waits for the requests in flight, as the other streams end.
    app[PREDICTION_STREAMS].stop()
