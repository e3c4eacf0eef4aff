"""`/v1/jobs`: submit, list, read (also as of a past instant), history, cancel, checkpoint, and
the SSE stream of a job's events. The handlers route and authenticate; the jobs feature's facade
(`controlplane.jobs.application`) decides."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from controlplane.events.records import RecordedEvent
from controlplane.http import params, query
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.keys import IMAGES, JOBS, LOCATION_ROOTS, PLANE, SUBMISSIONS
from controlplane.http.operations import (
    Answer,
    Operation,
    Param,
    add_operations,
    answer,
    links,
)
from controlplane.http.requests import (
    MAX_KEY,
    event_metadata,
    idempotency_key,
    idempotency_param,
    json_body,
    validated,
)
from controlplane.http.stream_events import follow
from controlplane.http.streams import SSE_EVENT, SSE_HEADERS, live_stream
from controlplane.instruments import sse_client
from controlplane.jobs.application import MAX_PAGE, JobsApplication
from controlplane.jobs.events import JobEvent
from controlplane.jobs.lifecycle import JOB, Job, JobStatus, evolve
from controlplane.jobs.manifest import JobSubmission
from controlplane.jobs.streams import job_stream
from controlplane.jobs.views import JobHistory, JobPage, JobView
from controlplane.tenants.principals import Principal

JOBS_APPLICATION = web.AppKey("jobs_application", JobsApplication)


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="cancelled by user", min_length=1, max_length=1000)

    @field_validator("reason")
    @classmethod
    def _storable(cls, value: str) -> str:
        # Postgres jsonb holds no NUL and only valid UTF-8 (json.loads lets surrogates through).
        if "\0" in value:
            raise ValueError("text must not contain NUL characters")
        value.encode("utf-8")
        return value


class SubmitQuery(query.Query):
    tenant: Annotated[str | None, query.text()] = Field(
        default=None, description="admins only: the tenant it is submitted for"
    )


class ListQuery(query.Query):
    state: list[Annotated[JobStatus, query.choice(JobStatus.__members__)]] = Field(
        default=[],
        max_length=len(JobStatus),
        description="only jobs in one of these states (repeat it for several)",
    )
    label: list[
        Annotated[str, query.text(MAX_KEY * 2, params.label_filter_schema(MAX_KEY * 2))]
    ] = Field(
        default=[],
        max_length=query.MAX_LABEL_FILTERS,
        description="only jobs carrying this label, KEY=VALUE (repeat it: all)",
    )
    cursor: Annotated[str | None, query.CURSOR] = Field(
        default=None, description="the next_cursor of the page before"
    )
    limit: Annotated[int, query.integer(1, MAX_PAGE)] = Field(
        default=50, description="jobs per page"
    )

    @field_validator("label")
    @classmethod
    def _pairs(cls, labels: list[str]) -> list[str]:
        for label in labels:
            key, sep, _ = label.partition("=")
            if not sep or not key:
                raise query.refuse(f"label filter must be KEY=VALUE, not {label!r}")
        return labels

    def labels(self) -> dict[str, str]:
        return dict(label.partition("=")[::2] for label in self.label)


class AsOfQuery(query.Query):
    as_of: Annotated[datetime | None, query.INSTANT] = Field(
        default=None,
        description="the job as it stood at this instant (RFC 3339, with its offset): "
        "its events up to then, folded",
    )


async def submit(request: web.Request) -> web.Response:
    who = principal(request)
    submission = validated(JobSubmission, await json_body(request))
    asked = query.parsed(request, SubmitQuery)
    tenant = acting_tenant(who, asked.tenant, "submits")
    key = idempotency_key(request)
    view, created = await request.app[JOBS_APPLICATION].submit(
        tenant, submission, event_metadata(request, who, tenant), key
    )
    headers = {"Location": f"/v1/jobs/{view.job_id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return answer(view, status=201, headers=headers)


async def list_jobs(request: web.Request) -> web.Response:
    who = principal(request)
    asked = query.parsed(request, ListQuery)
    page = await request.app[JOBS_APPLICATION].page(
        who, states=asked.state, labels=asked.labels(), cursor=asked.cursor, limit=asked.limit
    )
    return answer(page)


async def visible_job(request: web.Request, who: Principal, as_of: datetime | None = None) -> Job:
    """The job the path names, when `who` may see it (404 otherwise)."""
    return await request.app[JOBS_APPLICATION].visible(who, request.match_info["job_id"], as_of)


async def get_job(request: web.Request) -> web.Response:
    who = principal(request)
    as_of = query.parsed(request, AsOfQuery).as_of
    job = await visible_job(request, who, as_of)
    return answer(await request.app[JOBS_APPLICATION].view(job, now=as_of is None))


async def get_history(request: web.Request) -> web.Response:
    job = await visible_job(request, principal(request))
    return answer(await request.app[JOBS_APPLICATION].history(job))


async def cancel(request: web.Request) -> web.Response:
    who = principal(request)
    job = await visible_job(request, who)
    body = validated(CancelRequest, await json_body(request))
    metadata = event_metadata(request, who, job.tenant)
    return answer(await request.app[JOBS_APPLICATION].cancel(job, body.reason, metadata))


async def checkpoint(request: web.Request) -> web.Response:
    who = principal(request)
    job = await visible_job(request, who)
    metadata = event_metadata(request, who, job.tenant)
    view = await request.app[JOBS_APPLICATION].checkpoint(job, metadata)
    return answer(view, status=202)


async def stream_events(request: web.Request) -> web.StreamResponse:
    """SSE of the job's events: `id` is the global position; `Last-Event-ID` resumes after it;
    a comment heartbeat while idle; the stream ends once a terminal state has been sent."""
    who = principal(request)
    job = await visible_job(request, who)
    after = params.resume_after(request.query, request.headers)
    response = web.StreamResponse(headers=SSE_HEADERS)
    with await live_stream(request):
        await response.prepare(request)
        try:
            with sse_client("events"):
                await _stream(request, response, job, after)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away: nothing left to send, and nothing is lost (it resumes)
    return response


async def _stream(request: web.Request, response: web.StreamResponse, job: Job, after: int) -> None:
    jobs = request.app[JOBS]
    sender = _Sender(response, after)
    await follow(
        request, response, job_stream(job.job_id), lambda: jobs.history(job.job_id), sender
    )


class _Sender:
    """Writes a job's events as SSE, each once, in version order, folding the job's state."""

    def __init__(self, response: web.StreamResponse, after_position: int) -> None:
        self._response = response
        self._after = after_position
        self.version = 0
        self.job: Job | None = None
        self.finished = False

    async def send(self, recorded: RecordedEvent) -> None:
        if recorded.stream_version <= self.version or self.finished:
            return
        self.version = recorded.stream_version
        event = JOB.event_of(recorded)
        self.job = evolve(self.job, event)
        # Events up to Last-Event-ID were delivered before the client reconnected: folded for
        # the state, not sent again.
        if recorded.position > self._after:
            await self._write(recorded, event, self.job)
        self.finished = self.job.state.terminal

    async def _write(self, recorded: RecordedEvent, event: JobEvent, job: Job) -> None:
        payload = {
            "type": event.type_name,
            "version": recorded.stream_version,
            "position": recorded.position,
            "state": job.state.value,
            "attempt": job.attempt,
            "data": event.model_dump(mode="json"),
        }
        await self._response.write(
            f"id: {recorded.position}\nevent: {event.type_name}\n"
            f"data: {json.dumps(payload)}\n\n".encode()
        )


JOB_OPERATIONS = (
    "getJob",
    "getJobHistory",
    "getJobLogs",
    "getJobMetrics",
    "cancelJob",
    "checkpointJob",
)
"""What can be done with a job a response names: its OpenAPI links (clients, and generated
tests, follow them from a submission to the job's reads, cancellation and checkpoint)."""
JOB_ID = Param("job_id", "path", "the job's id", {"type": "string"})


def _job(description: str) -> Answer:
    """An answer with the job's view, linked to the operations on that job."""
    return Answer(description, JobView, links=links("job_id", *JOB_OPERATIONS))


NOT_FOUND = "no such job (or another tenant's)"
OPERATIONS = (
    Operation(
        "post",
        "/v1/jobs",
        submit,
        "submitJob",
        "Submit a job (committed before the 201)",
        {201: _job("the job (also for an idempotent retry)")},
        {
            400: "malformed request",
            401: "missing or wrong token",
            403: "a tenant's token submitting for another tenant; a file:// data.source or "
            "results.location outside the operator's roots for the tenant; or a webhook_url "
            "whose host is or resolves to a non-public address (not in "
            "TRAINYARD_WEBHOOK_ALLOW_NETWORKS) or does not resolve; or a job that alone asks for "
            "more CPUs or memory than its tenant may hold at all (the field names which)",
            409: "the Idempotency-Key was used for a different manifest",
            422: "invalid manifest fields, each listed (a reserved environment name as "
            "`env.NAME`; memory_mb also past the largest node's); an image the service does not "
            "allow (`image`); or an unknown tenant",
            429: "the tenant's submissions_per_s (with Retry-After) or queued_jobs limit reached "
            "(field names which)",
        },
        query=SubmitQuery,
        params=(idempotency_param("retries with the same key return the same job"),),
        body=JobSubmission,
        body_required=True,
    ),
    Operation(
        "get",
        "/v1/jobs",
        list_jobs,
        "listJobs",
        "List jobs, newest first",
        {200: Answer("a page of jobs", JobPage)},
        {
            400: "malformed request: a parameter (the field names which)",
            401: "missing or wrong token",
        },
        query=ListQuery,
    ),
    Operation(
        "get",
        "/v1/jobs/{job_id}",
        get_job,
        "getJob",
        "A job's status, now or as of a past instant",
        {200: _job("the job")},
        {400: "malformed as_of", 401: "missing or wrong token", 404: NOT_FOUND},
        query=AsOfQuery,
        params=(JOB_ID,),
    ),
    Operation(
        "get",
        "/v1/jobs/{job_id}/history",
        get_history,
        "getJobHistory",
        "Every event of the job with its time, actor and reason, and every attempt to deliver "
        "its webhook notifications",
        {200: Answer("the history", JobHistory)},
        {401: "missing or wrong token", 404: NOT_FOUND},
        params=(JOB_ID,),
    ),
    Operation(
        "get",
        "/v1/jobs/{job_id}/events",
        stream_events,
        "streamJobEvents",
        "Server-sent events of the job; ends after a terminal state",
        {200: Answer("the event stream", SSE_EVENT["schema"], media="text/event-stream")},
        {
            400: "malformed after or Last-Event-ID",
            401: "missing or wrong token",
            404: NOT_FOUND,
            429: "the tenant's live streams limit, or the server's, reached; Retry-After",
        },
        description="Each SSE `id` is the event's global position; send it back as "
        "`Last-Event-ID` to resume exactly after it. A comment heartbeat is sent while idle.",
        query=query.ResumeQuery,
        params=(
            JOB_ID,
            Param("Last-Event-ID", "header", "resume after this position", params.POSITION_SCHEMA),
        ),
    ),
    Operation(
        "post",
        "/v1/jobs/{job_id}/cancel",
        cancel,
        "cancelJob",
        "Cancel the job",
        {200: _job("the cancelled job")},
        {
            400: "malformed request",
            401: "missing or wrong token",
            404: NOT_FOUND,
            409: "illegal in the job's current state",
            422: "invalid fields, each listed",
        },
        params=(JOB_ID,),
        body=CancelRequest,
    ),
    Operation(
        "post",
        "/v1/jobs/{job_id}/checkpoint",
        checkpoint,
        "checkpointJob",
        "Ask the job's learners for a checkpoint now (PROCESSING jobs)",
        {202: _job("the request is recorded")},
        {
            401: "missing or wrong token",
            404: NOT_FOUND,
            409: "not PROCESSING, or a checkpoint request is pending already",
        },
        description="One request is pending at a time: until the learners have saved the "
        "checkpoint (or the attempt ends), another is a 409.",
        params=(JOB_ID,),
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
    app.on_startup.append(_open)


async def _open(app: web.Application) -> None:
    # After the composition root's parts are open (cleanup contexts start first).
    plane = app[PLANE]
    app[JOBS_APPLICATION] = JobsApplication(
        plane.jobs,
        plane.pool,
        plane.store,
        images=app[IMAGES],
        roots=app[LOCATION_ROOTS],
        submissions=app[SUBMISSIONS],
        webhook_targets=plane.webhooks.targets,
    )
