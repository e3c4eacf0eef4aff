"""The jobs feature as its front ends use it: submit, list, read, history, cancel, checkpoint.

A facade in the sense of eventsourcing's Application: it takes requests already parsed (the
HTTP layer routes and authenticates, nothing more), checks them against the rules and the
tenant's limits before anything is written, runs them through the `Jobs` service, and answers
with the views its readers get (`jobs.views`). What it refuses it raises as a `Refusal`.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from uuid import UUID

import asyncpg

from controlplane.admission import gate
from controlplane.admission.policy import NOTHING, Room, job_room
from controlplane.agents.views import live_nodes
from controlplane.events.metadata import Metadata
from controlplane.events.records import RecordedEvent
from controlplane.events.store import EventStore
from controlplane.instruments import LIMIT_REFUSALS
from controlplane.jobs.images import ImageAllowlist, ImageRefused
from controlplane.jobs.lifecycle import (
    JOB,
    Cancel,
    Job,
    JobStatus,
    Refused,
    RequestCheckpoint,
    evolve,
)
from controlplane.jobs.locations import LocationRefused, Roots, check_manifest_locations
from controlplane.jobs.manifest import JobManifest, JobSubmission
from controlplane.jobs.projection import reason
from controlplane.jobs.service import IdempotencyMismatch, Jobs, idempotent_id
from controlplane.jobs.streams import job_stream
from controlplane.jobs.views import HistoryEntry, JobHistory, JobPage, JobView, list_jobs
from controlplane.refusals import Refusal
from controlplane.refusals import Refused as Kind
from controlplane.scheduling.unschedulable import LiveNodes, demand_of, unschedulable_reason
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.principals import Principal
from controlplane.tenants.submissions import SubmissionRates
from controlplane.webhooks.deliveries import delivery_history
from controlplane.webhooks.targets import CheckingResolver

MAX_PAGE = 500
"""The most jobs one page lists."""


class JobsApplication:
    def __init__(
        self,
        jobs: Jobs,
        pool: asyncpg.Pool,
        store: EventStore,
        *,
        images: ImageAllowlist,
        roots: Roots,
        submissions: SubmissionRates,
        webhook_targets: CheckingResolver,
    ) -> None:
        self.jobs = jobs
        self._pool = pool
        self._store = store
        self._images = images
        self._roots = roots
        self._submissions = submissions
        self._webhook_targets = webhook_targets

    async def submit(
        self, tenant: str, submission: JobSubmission, metadata: Metadata, key: str | None
    ) -> tuple[JobView, bool]:
        """The job submitted (committed before this returns), and whether it is new: a retry
        with the same idempotency key finds the job its first try made."""
        manifest, secret_env = submission.split()
        try:
            self._images.admit(manifest.image)
        except ImageRefused as exc:
            raise Refusal(Kind.INVALID, str(exc), field="image") from exc
        await self.check_manifest(manifest, tenant)
        # A retry of a submission that was accepted finds its job whatever the limits say now
        # (its first try passed them); only a new job is held to them.
        limits = None
        if key is None or await self.jobs.load(idempotent_id(tenant, key)) is None:
            limits = (await self.admit(tenant, manifest)).for_job()
        try:
            job, created = await self.jobs.submit(
                tenant, manifest, metadata, key, limits, secret_env=secret_env
            )
        except IdempotencyMismatch as exc:
            raise Refusal(Kind.CONFLICT, str(exc)) from exc
        return await self.view(job), created

    async def check_manifest(
        self, manifest: JobManifest, tenant: str, *, field_prefix: str = ""
    ) -> None:
        """What a manifest must pass beyond its schema for `tenant` (a job's, or a search's
        trial template, whose fields are named under `field_prefix`): `file://` locations under
        the tenant's roots and a webhook URL that reaches a public address."""
        try:
            check_manifest_locations(
                manifest.data.source if manifest.data else None,
                manifest.results.location if manifest.results else None,
                self._roots,
                tenant,
            )
        except LocationRefused as exc:
            # The location is well formed (the manifest's schema says so): the tenant may not
            # use that place.
            raise Refusal(Kind.FORBIDDEN, exc.message, field=field_prefix + exc.field) from exc
        if manifest.webhook_url is not None:
            await self._webhook_targets.admit(
                str(manifest.webhook_url), field_prefix + "webhook_url"
            )

    async def admit(
        self, tenant: str, manifest: JobManifest, *, also: Room = NOTHING
    ) -> TenantLimits:
        """The tenant's limits, once a submission passes them (its rate, then the room its job
        takes and `also`: see controlplane/admission) and the cluster could ever hold the job.
        One query reads the limits, what the tenant holds and the largest node's memory; the
        rate is checked first, so that a refused flood costs nothing more."""
        usage = await gate.usage_of(self._pool, tenant)
        limits = usage.limits
        wait_s = self._submissions.take(tenant, limits, time.monotonic())
        if wait_s:
            LIMIT_REFUSALS.add(1, {"limit": "submissions_per_s", "tenant": tenant})
            raise Refusal(
                Kind.LIMITED,
                f"tenant {tenant!r} submits at most {limits.submissions_per_s:g} jobs per second "
                f"(burst {limits.submission_burst}); retry after the Retry-After seconds",
                field="submissions_per_s",
                retry_after_s=wait_s,
            )
        gate.hold(tenant, usage, job_room(manifest) + also)
        largest = usage.largest_memory_mb
        if largest is not None and manifest.memory_mb > largest:
            raise Refusal(
                Kind.INVALID,
                f"memory_mb {manifest.memory_mb} is more than any node has (the largest has "
                f"{largest} MiB): no node could ever run it",
                field="memory_mb",
            )
        return limits

    async def page(
        self,
        who: Principal,
        *,
        states: Sequence[JobStatus],
        labels: Mapping[str, str],
        cursor: str | None,
        limit: int,
    ) -> JobPage:
        """The jobs `who` may see, newest first, filtered; at most `limit` from `cursor`."""
        found, total = await list_jobs(
            self._pool,
            tenant=None if who.is_admin else who.tenant,
            states=states,
            labels=labels,
            after=decode_cursor(cursor),
            limit=limit + 1,
        )
        page = found[:limit]
        more = len(found) > limit
        next_cursor = encode_cursor(page[-1].submitted_at, page[-1].job_id) if more else None
        live = await live_nodes(self._pool)
        return JobPage(
            jobs=[_view(job, live) for job in page], next_cursor=next_cursor, total=total
        )

    async def visible(self, who: Principal, job_id: str, as_of: datetime | None = None) -> Job:
        """The job `job_id` names (as it stood at `as_of`), when `who` may see it. Another
        tenant's job is "not found", never "forbidden": its existence is not disclosed."""
        try:
            uuid = UUID(job_id)
        except ValueError:
            raise Refusal(Kind.NOT_FOUND, "no such job", field="job_id") from None
        job = await self.jobs.load(uuid, as_of=as_of)
        if job is None or not who.may_see(job.tenant):
            raise Refusal(Kind.NOT_FOUND, "no such job")
        return job

    async def view(self, job: Job, *, now: bool = True) -> JobView:
        """The job as its readers see it; `now` False for views of the past (no live reason
        why a queued job cannot fit)."""
        return _view(job, await live_nodes(self._pool) if now else None)

    async def history(self, job: Job) -> JobHistory:
        entries = []
        state: Job | None = None
        for recorded in await self.jobs.history(job.job_id):
            state = evolve(state, JOB.event_of(recorded))
            entries.append(_history_entry(recorded, state))
        # The notifications of the job's events, from a stream of their own (webhooks.streams).
        deliveries = await delivery_history(self._store, job_stream(job.job_id))
        return JobHistory(id=job.job_id, history=entries, webhooks=deliveries)

    async def cancel(self, job: Job, why: str, metadata: Metadata) -> JobView:
        command = Cancel(reason=why, at=self.jobs.clock.now())
        return _view(await self._execute(job, command, metadata), None)

    async def checkpoint(self, job: Job, metadata: Metadata) -> JobView:
        command = RequestCheckpoint(at=self.jobs.clock.now())
        return _view(await self._execute(job, command, metadata), None)

    async def _execute(
        self, job: Job, command: Cancel | RequestCheckpoint, metadata: Metadata
    ) -> Job:
        try:
            return await self.jobs.execute(job.job_id, command, metadata)
        except Refused as exc:
            raise Refusal(Kind.NOT_FOUND if exc.not_found else Kind.CONFLICT, str(exc)) from exc


def _view(job: Job, live: LiveNodes | None) -> JobView:
    reason_ = None
    if live is not None and job.state is JobStatus.QUEUED:
        reason_ = unschedulable_reason(demand_of(job.manifest), live)
    return JobView(**dict(job), unschedulable_reason=reason_)


def _history_entry(recorded: RecordedEvent, job: Job) -> HistoryEntry:
    event = JOB.event_of(recorded)
    return HistoryEntry(
        version=recorded.stream_version,
        position=recorded.position,
        event=event.type_name,
        state=job.state,
        attempt=job.attempt,
        at=event.at,
        actor=recorded.metadata.actor,
        reason=reason(event),
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
        raise Refusal(Kind.MALFORMED, "invalid cursor", field="cursor") from None
