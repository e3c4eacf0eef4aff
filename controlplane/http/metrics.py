"""`GET /v1/jobs/{job_id}/metrics`: the training metrics the job's learners reported."""

from __future__ import annotations

from aiohttp import web

from controlplane.http.auth import principal
from controlplane.http.jobs import JOB_ID, NOT_FOUND, visible_job
from controlplane.http.keys import POOL
from controlplane.http.operations import (
    Answer,
    Operation,
    add_operations,
    answer,
)
from controlplane.logs.metric_views import JobMetrics, job_metrics


async def get_metrics(request: web.Request) -> web.Response:
    job = await visible_job(request, principal(request))
    return answer(await job_metrics(request.app[POOL], job.job_id))


OPERATIONS = (
    Operation(
        "get",
        "/v1/jobs/{job_id}/metrics",
        get_metrics,
        "getJobMetrics",
        "The job's training metrics, as its learners reported them",
        {200: Answer("every metric report, in the order stored", JobMetrics)},
        {401: "missing or wrong token", 404: NOT_FOUND},
        params=(JOB_ID,),
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
