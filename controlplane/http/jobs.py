"""`/v1/jobs`: submit, list, read (also as of a past instant), history, cancel, checkpoint, and
the SSE stream of a job's events."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from controlplane.admission.policy import NOTHING, Room, job_room
from controlplane.agents.views import live_nodes
from controlplane.events.records import RecordedEvent
from controlplane.http import params
from controlplane.http.admission import hold, usage_of
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.errors import error, validation_error
from controlplane.http.keys import (
    IMAGES,
    JOBS,
    LOCATION_ROOTS,
    POOL,
    STORE,
    SUBMISSIONS,
)
from controlplane.http.requests import MAX_KEY, event_metadata, idempotency_key, json_body
from controlplane.http.stream_events import follow
from controlplane.http.streams import SSE_HEADERS, live_stream
from controlplane.http.webhooks import check_webhook_url, delivery_history
from controlplane.instruments import LIMIT_REFUSALS, sse_client
from controlplane.jobs.events import JobEvent
from controlplane.jobs.images import ImageRefused
from controlplane.jobs.lifecycle import (
    JOB,
    Cancel,
    Job,
    JobStatus,
    Refused,
    RequestCheckpoint,
    evolve,
)
from controlplane.jobs.locations import LocationRefused, check_manifest_locations
from controlplane.jobs.manifest import JobManifest, JobSubmission
from controlplane.jobs.projection import reason
from controlplane.jobs.service import IdempotencyMismatch, idempotent_id
from controlplane.jobs.streams import job_stream
from controlplane.jobs.views import list_jobs as listed_jobs
from controlplane.scheduling.unschedulable import LiveNodes, demand_of, unschedulable_reason
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.principals import Principal

MAX_PAGE = 500


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


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{job_id}", get_job)
    app.router.add_get("/v1/jobs/{job_id}/history", get_history)
    app.router.add_get("/v1/jobs/{job_id}/events", stream_events)
    app.router.add_post("/v1/jobs/{job_id}/cancel", cancel)
    app.router.add_post("/v1/jobs/{job_id}/checkpoint", checkpoint)


def job_view(job: Job, live: LiveNodes | None = None) -> dict[str, Any]:
    """The job as the API shows it; a queued job that can never fit says why (`live` is
    the cluster now, None for views of the past or of jobs that left the queue)."""
    reason = None
    if live is not None and job.state is JobStatus.QUEUED:
        reason = unschedulable_reason(demand_of(job.manifest), live)
    return {
        "id": str(job.job_id),
        **job.model_dump(mode="json", exclude={"job_id"}),
        "unschedulable_reason": reason,
    }


async def _live_nodes(request: web.Request) -> LiveNodes:
    return await live_nodes(request.app[POOL])


async def submit(request: web.Request) -> web.Response:
    who = principal(request)
    body = await json_body(request)
    try:
        manifest, secret_env = JobSubmission.model_validate(body).split()
    except ValidationError as exc:
        raise validation_error(exc) from exc
    try:
        request.app[IMAGES].admit(manifest.image)
    except ImageRefused as exc:
        raise error(422, str(exc), field="image") from exc
    tenant = acting_tenant(who, params.text(request.query.get("tenant"), "tenant"), "submits")
    key = idempotency_key(request)
    metadata = event_metadata(request, who, tenant)
    await check_manifest(request, manifest, tenant)
    jobs = request.app[JOBS]
    # A retry of a submission that was accepted finds its job whatever the limits say now
    # (its first try passed them); only a new job is held to them.
    limits = None
    if key is None or await jobs.load(idempotent_id(tenant, key)) is None:
        limits = (await admit(request, tenant, manifest)).for_job()
    try:
        job, created = await jobs.submit(
            tenant, manifest, metadata, key, limits, secret_env=secret_env
        )
    except IdempotencyMismatch as exc:
        raise error(409, str(exc)) from exc
    headers = {"Location": f"/v1/jobs/{job.job_id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return web.json_response(job_view(job, await _live_nodes(request)), status=201, headers=headers)


async def check_manifest(
    request: web.Request, manifest: JobManifest, tenant: str, *, field_prefix: str = ""
) -> None:
    """What a manifest must pass beyond its schema for `tenant` (a job's, or a search's trial
    template, whose fields are named under `field_prefix`): `file://` locations under the
    tenant's roots and a webhook URL that reaches a public address; 422 naming the field."""
    try:
        check_manifest_locations(
            manifest.data.source if manifest.data else None,
            manifest.results.location if manifest.results else None,
            request.app[LOCATION_ROOTS],
            tenant,
        )
    except LocationRefused as exc:
        raise error(422, exc.message, field=field_prefix + exc.field) from exc
    if manifest.webhook_url is not None:
        await check_webhook_url(request, str(manifest.webhook_url), field_prefix + "webhook_url")


async def admit(
    request: web.Request, tenant: str, manifest: JobManifest, *, also: Room = NOTHING
) -> TenantLimits:
    """The tenant's limits, once the submission passes them (its rate, then the room its job
    takes and `also`: see controlplane/admission) and the cluster could ever hold the job;
    else the error
    (nothing written). One query reads the limits, what the tenant holds and the largest
    node's memory; the rate is checked first, so that a refused flood costs nothing more."""
    usage = await usage_of(request, tenant)
    limits = usage.limits
    wait_s = request.app[SUBMISSIONS].take(tenant, limits, time.monotonic())
    if wait_s:
        LIMIT_REFUSALS.add(1, {"limit": "submissions_per_s", "tenant": tenant})
        raise error(
            429,
            f"tenant {tenant!r} submits at most {limits.submissions_per_s:g} jobs per second "
            f"(burst {limits.submission_burst}); retry after the Retry-After seconds",
            field="submissions_per_s",
            retry_after_s=wait_s,
        )
    hold(tenant, usage, job_room(manifest) + also)
    largest = usage.largest_memory_mb
    if largest is not None and manifest.memory_mb > largest:
        raise error(
            422,
            f"memory_mb {manifest.memory_mb} is more than any node has (the largest has "
            f"{largest} MiB): no node could ever run it",
            field="memory_mb",
        )
    return limits


async def list_jobs(request: web.Request) -> web.Response:
    who = principal(request)
    query = request.query
    states = [
        JobStatus(params.choice(s, "state", JobStatus.__members__))
        for s in query.getall("state", [])
    ]
    labels: dict[str, str] = {}
    for label in query.getall("label", []):
        key, sep, value = params.text(label, "label", max_length=MAX_KEY * 2).partition("=")
        if not sep or not key:
            raise error(400, f"label filter must be KEY=VALUE, not {label!r}", field="label")
        labels[key] = value
    limit = params.integer(query.get("limit"), "limit", minimum=1, maximum=MAX_PAGE) or 50
    found, total = await listed_jobs(
        request.app[POOL],
        tenant=None if who.is_admin else who.tenant,
        states=states,
        labels=labels,
        after=decode_cursor(query.get("cursor")),
        limit=limit + 1,
    )
    page = found[:limit]
    cursor = encode_cursor(page[-1].submitted_at, page[-1].job_id) if len(found) > limit else None
    live = await _live_nodes(request)
    return web.json_response(
        {"jobs": [job_view(job, live) for job in page], "next_cursor": cursor, "total": total}
    )


def encode_cursor(submitted_at: datetime, job_id: UUID) -> str:
    return base64.urlsafe_b64encode(f"{submitted_at.isoformat()}|{job_id}".encode()).decode()


def decode_cursor(cursor: str | None) -> tuple[datetime, UUID] | None:
    if cursor is None:
        return None
    try:
        when, _, job_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        submitted_at = datetime.fromisoformat(when)
        if submitted_at.tzinfo is None:
            raise ValueError("no offset")
        return submitted_at.astimezone(UTC), UUID(job_id)
    except (ValueError, OverflowError):
        # What encode_cursor wrote, or nothing: a cursor is not for clients to make up.
        raise error(400, "invalid cursor", field="cursor") from None


def _job_id(request: web.Request) -> UUID:
    return params.uuid(request.match_info["job_id"], "job_id", status=404, message="no such job")


async def visible_job(request: web.Request, who: Principal, as_of: datetime | None = None) -> Job:
    job = await request.app[JOBS].load(_job_id(request), as_of=as_of)
    # Another tenant's job is "not found", never "forbidden": its existence is not disclosed.
    if job is None or not who.may_see(job.tenant):
        raise error(404, "no such job")
    return job


async def get_job(request: web.Request) -> web.Response:
    who = principal(request)
    as_of = params.timestamp(request.query.get("as_of"), "as_of")
    job = await visible_job(request, who, as_of)
    return web.json_response(job_view(job, None if as_of else await _live_nodes(request)))


async def get_history(request: web.Request) -> web.Response:
    who = principal(request)
    job = await visible_job(request, who)
    entries = []
    state: Job | None = None
    for recorded in await request.app[JOBS].history(job.job_id):
        state = evolve(state, JOB.event_of(recorded))
        entries.append(_history_entry(recorded, state))
    # The notifications of the job's events, from a stream of their own (see webhooks.streams).
    deliveries = await delivery_history(request.app[STORE], job_stream(job.job_id))
    return web.json_response({"id": str(job.job_id), "history": entries, "webhooks": deliveries})


def _history_entry(recorded: RecordedEvent, job: Job) -> dict[str, Any]:
    event = JOB.event_of(recorded)
    return {
        "version": recorded.stream_version,
        "position": recorded.position,
        "event": event.type_name,
        "state": job.state.value,
        "attempt": job.attempt,
        "at": event.at.isoformat(),
        "actor": recorded.metadata.actor,
        "reason": reason(event),
    }


async def cancel(request: web.Request) -> web.Response:
    who = principal(request)
    job = await visible_job(request, who)
    try:
        body = CancelRequest.model_validate(await json_body(request))
    except ValidationError as exc:
        raise validation_error(exc) from exc
    command = Cancel(reason=body.reason, at=request.app[JOBS].clock.now())
    return web.json_response(job_view(await _execute(request, who, job, command)))


async def checkpoint(request: web.Request) -> web.Response:
    who = principal(request)
    job = await visible_job(request, who)
    job = await _execute(request, who, job, RequestCheckpoint(at=request.app[JOBS].clock.now()))
    return web.json_response(job_view(job), status=202)


async def _execute(
    request: web.Request, who: Principal, job: Job, command: Cancel | RequestCheckpoint
) -> Job:
    try:
        return await request.app[JOBS].execute(
            job.job_id, command, event_metadata(request, who, job.tenant)
        )
    except Refused as exc:
        raise error(404 if exc.not_found else 409, str(exc)) from exc


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
