"""`/v1/inference` and an inference job's reads: submit one (it is a job: read, stream and
cancel it under `/v1/jobs/{job_id}`), its statistics (exact; also as an SSE stream), and its
queries' results in order. The handlers route and authenticate; the inference facade
(`controlplane.inference.application`) decides."""

from __future__ import annotations

import contextlib
import json
from typing import Annotated

from aiohttp import web
from pydantic import Field, ValidationError

from controlplane.http import query
from controlplane.http.auth import principal
from controlplane.http.deployments import (
    ActingQuery,
    acting,
    answer,
    retried_when_busy,
)
from controlplane.http.errors import validation_error
from controlplane.http.jobs import JOB_ID, JOBS_APPLICATION
from controlplane.http.keys import IMAGES, PLANE
from controlplane.http.operations import Answer, Operation, Param, add_operations, links
from controlplane.http.requests import (
    event_metadata,
    idempotency_key,
    idempotency_param,
    json_body,
    validated,
)
from controlplane.http.streams import SSE_EVENT, SSE_HEADERS, live_stream
from controlplane.inference.application import InferenceApplication
from controlplane.inference.spec import InferenceRequest
from controlplane.inference.views import InferenceStats, QueryPage
from controlplane.instruments import sse_client
from controlplane.jobs.views import JobView

INFERENCE_APPLICATION = web.AppKey("inference_application", InferenceApplication)
MAX_QUERIES_PAGE = 1000


class QueriesQuery(query.Query):
    after: Annotated[int | None, query.integer(0, 2**62)] = Field(
        default=None, description="queries with a greater index (default: from the first)"
    )
    limit: Annotated[int, query.integer(1, MAX_QUERIES_PAGE)] = Field(
        default=100, description="at most this many (default 100, at most 1000)"
    )


async def submit(request: web.Request) -> web.Response:
    who = principal(request)
    body = validated(InferenceRequest, await json_body(request))
    tenant = acting(request, "submits")
    key = idempotency_key(request)
    metadata = event_metadata(request, who, tenant)
    try:
        view, created = await request.app[INFERENCE_APPLICATION].submit(tenant, body, metadata, key)
    except ValidationError as exc:  # the model version's metadata: each field listed
        raise validation_error(exc) from exc
    headers = {"Location": f"/v1/jobs/{view.job_id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return answer(view, status=201, headers=headers)


async def get_stats(request: web.Request) -> web.Response:
    inference = request.app[INFERENCE_APPLICATION]
    job = await inference.job(principal(request), request.match_info["job_id"])
    return answer(await inference.stats(job))


async def stream_stats(request: web.Request) -> web.StreamResponse:
    """SSE of the job's statistics: a `stats` event now and whenever they change (looked at
    each second); the stream ends after the job has ended (its final figures sent)."""
    inference = request.app[INFERENCE_APPLICATION]
    job = await inference.job(principal(request), request.match_info["job_id"])
    changes = inference.changes(job)
    response = web.StreamResponse(headers=SSE_HEADERS)
    with await live_stream(request):
        await response.prepare(request)
        try:
            with sse_client("stats"):
                async with contextlib.aclosing(changes):
                    async for change in changes:
                        await response.write(_event(change))
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away; nothing is lost (the figures are recomputed)
    return response


def _event(stats: InferenceStats | None) -> bytes:
    if stats is None:
        return b": heartbeat\n\n"
    data = json.dumps(stats.model_dump(mode="json", by_alias=True))
    return f"event: stats\ndata: {data}\n\n".encode()


async def list_queries(request: web.Request) -> web.Response:
    inference = request.app[INFERENCE_APPLICATION]
    job = await inference.job(principal(request), request.match_info["job_id"])
    asked = query.parsed(request, QueriesQuery)
    return answer(await inference.queries(job, after=asked.after, limit=asked.limit))


MALFORMED = "malformed request: a parameter or JSON body (the field names which)"
UNAUTHORIZED = "missing or wrong token"
NOT_FOUND = "no such job (or none of the caller's), or not an inference job"
INFERENCE_JOB = Param("job_id", "path", "the inference job's id", JOB_ID.schema)
OPERATIONS = (
    Operation(
        "post",
        "/v1/inference",
        retried_when_busy(submit),
        "submitInference",
        "Submit an inference job: a model version over an input set, a query per batch, "
        "sharing replicas' time with other jobs by weight",
        {
            201: Answer(
                "the job (read, stream and cancel it as a job)",
                JobView,
                links=links(
                    "job_id",
                    "getJob",
                    "getJobHistory",
                    "getJobLogs",
                    "cancelJob",
                    "getInferenceStats",
                    "listInferenceQueries",
                ),
            )
        },
        {
            400: MALFORMED,
            401: UNAUTHORIZED,
            403: "a tenant's token acting for another tenant; or an inference job that alone "
            "asks for more than its tenant may hold at all (the field names the limit)",
            404: "no such model, version or alias (or none the caller may see): the field "
            "`model` names it",
            409: "an Idempotency-Key used for another job",
            422: "invalid fields, each listed (the model reference's form, the input set, the "
            "image)",
            429: "over a tenant limit (queued jobs, submissions per second, live streams)",
        },
        query=ActingQuery,
        params=(
            idempotency_param(
                "a retry with the same key gets the job the first try made, never a second"
            ),
        ),
        body=InferenceRequest,
        body_required=True,
    ),
    Operation(
        "get",
        "/v1/jobs/{job_id}/stats",
        get_stats,
        "getInferenceStats",
        "An inference job's statistics, exact, and each replica's",
        {200: Answer("the figures", InferenceStats)},
        {400: MALFORMED, 401: UNAUTHORIZED, 404: NOT_FOUND},
        params=(INFERENCE_JOB,),
    ),
    Operation(
        "get",
        "/v1/jobs/{job_id}/stats/events",
        stream_stats,
        "streamInferenceStats",
        "SSE: a `stats` event (the figures) now and at each change; ends once the job has ended",
        {
            200: Answer(
                "text/event-stream of `stats` events",
                SSE_EVENT["schema"],
                media="text/event-stream",
            )
        },
        {
            400: MALFORMED,
            401: UNAUTHORIZED,
            404: NOT_FOUND,
            429: "over a tenant limit (queued jobs, submissions per second, live streams)",
        },
        params=(INFERENCE_JOB,),
    ),
    Operation(
        "get",
        "/v1/jobs/{job_id}/queries",
        list_queries,
        "listInferenceQueries",
        "An inference job's queries and their results, in order",
        {200: Answer("the queries", QueryPage)},
        {400: MALFORMED, 401: UNAUTHORIZED, 404: NOT_FOUND},
        query=QueriesQuery,
        params=(INFERENCE_JOB,),
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
    app.on_startup.append(_open)


async def _open(app: web.Application) -> None:
    # After the composition root's parts are open (cleanup contexts start first), and after
    # the jobs facade it submits through (app.py adds the jobs routes first).
    plane = app[PLANE]
    app[INFERENCE_APPLICATION] = InferenceApplication(
        plane.inference, app[JOBS_APPLICATION], plane.tasks, plane.pool, images=app[IMAGES]
    )
