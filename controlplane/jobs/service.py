"""Carrying out job commands against the event store: load, decide, append, retry on conflict."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from itertools import takewhile

from controlplane.events.errors import ConcurrencyError
from controlplane.events.metadata import Metadata
from controlplane.events.records import RecordedEvent
from controlplane.events.store import EventStore
from controlplane.invariants import InvariantBroken
from controlplane.jobs.events import JobEvent, job_event
from controlplane.jobs.lifecycle import Command, Job, Refused, Submit, decide, evolve, replay
from controlplane.jobs.limits import JobLimits
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.streams import job_stream
from controlplane.jobs.tracing import command_span_name, job_root, job_span, tracer
from controlplane.queries import Q

IDEMPOTENCY_NAMESPACE = uuid.UUID("5b0e4c1e-7d2a-4e8a-9f57-3c1d2b9a6e10")
"""Job ids of idempotent submissions are uuid5(namespace, tenant + key): a retry finds its job."""

CONFLICT_RETRIES = 10


class IdempotencyMismatch(Exception):
    """An Idempotency-Key reused for a different manifest; nothing was written."""


def now() -> datetime:
    return datetime.now(UTC)


def idempotent_id(tenant: str, idempotency_key: str) -> uuid.UUID:
    """The id of the job a tenant submits with `idempotency_key`, whichever try creates it."""
    return uuid.uuid5(IDEMPOTENCY_NAMESPACE, f"{tenant}\n{idempotency_key}")


class Jobs:
    """Job commands and reads, with the job's own stream as the only truth."""

    def __init__(self, store: EventStore) -> None:
        self._store = store

    async def history(self, job_id: uuid.UUID) -> list[RecordedEvent]:
        return await self._store.read_stream(job_stream(job_id))

    async def current(self, job_id: uuid.UUID) -> tuple[Job | None, int]:
        """The job now, and its stream's version."""
        history = await self.history(job_id)
        return replay(_job_events(history)), len(history)

    async def load(self, job_id: uuid.UUID, *, as_of: datetime | None = None) -> Job | None:
        """The job now, or as it was at `as_of` (None if it did not exist then)."""
        events: Iterable[JobEvent] = _job_events(await self.history(job_id))
        if as_of is not None:
            # The instant each event says it happened (the times users see), and a prefix,
            # not a filter: a stream's versions are folded in order or not at all.
            events = takewhile(lambda event: event.at <= as_of, events)
        return replay(events)

    async def submit(
        self,
        tenant: str,
        manifest: JobManifest,
        metadata: Metadata,
        idempotency_key: str | None = None,
        limits: JobLimits | None = None,
        *,
        secret_env: Mapping[str, str] | None = None,
    ) -> tuple[Job, bool]:
        """Submit a job, to run under `limits` (None: the defaults); returns it and whether it
        was created now (False for a retry). Its `secret_env` is stored apart from the event
        log, in the same transaction as the job's first event (a retry keeps the secrets of the
        job it finds)."""
        job_id = uuid.uuid4() if idempotency_key is None else idempotent_id(tenant, idempotency_key)
        command = Submit(
            job_id=job_id,
            tenant=tenant,
            manifest=manifest,
            at=now(),
            limits=limits or JobLimits(),
        )
        events = decide(command, None)
        # The root of the job's trace (a child of the API request's span).
        attributes = {"trainyard.job.id": str(job_id), "trainyard.tenant": tenant}
        try:
            with tracer.start_as_current_span("job.submit", attributes=attributes):
                if secret_env:
                    await self._submit_with_secrets(job_id, tenant, events, metadata, secret_env)
                else:
                    await self._store.append(job_stream(job_id), 0, events, metadata.traced())
        except ConcurrencyError:
            # Only an idempotent retry can collide: the job exists already.
            existing = await self.load(job_id)
            if existing is None:
                raise InvariantBroken(
                    f"job {job_id} conflicted on submission but has no events"
                ) from None
            if existing.manifest != manifest:
                raise IdempotencyMismatch(
                    f"Idempotency-Key {idempotency_key!r} was used for job {job_id} with a "
                    "different manifest"
                ) from None
            return existing, False
        job = replay(events)
        if job is None:
            raise InvariantBroken(f"job {job_id}: its submission's events make no job")
        return job, True

    async def _submit_with_secrets(
        self,
        job_id: uuid.UUID,
        tenant: str,
        events: list[JobEvent],
        metadata: Metadata,
        secret_env: Mapping[str, str],
    ) -> None:
        async with self._store.pool.acquire() as conn, conn.transaction():
            await self._store.append(job_stream(job_id), 0, events, metadata.traced(), conn=conn)
            await conn.execute(Q["insert_job_secret_env"], job_id, tenant, json.dumps(secret_env))

    async def execute(self, job_id: uuid.UUID, command: Command, metadata: Metadata) -> Job:
        """Decide `command` on the job's latest state and append; Refused if illegal. The
        step is a span in the job's trace, and so are the events' metadata."""
        history = await self.history(job_id)
        attributes = {"trainyard.job.id": str(job_id)}
        with job_span(command_span_name(command), job_root(history), attributes) as span:
            metadata = metadata.traced()
            for _ in range(CONFLICT_RETRIES):
                job = replay(_job_events(history))
                events = decide(command, job)
                try:
                    await self._store.append(job_stream(job_id), len(history), events, metadata)
                except ConcurrencyError:
                    # Someone else changed the job meanwhile: decide again on its new state.
                    history = await self.history(job_id)
                    continue
                for event in events:
                    job = evolve(job, event)
                if job is None:
                    raise InvariantBroken(f"job {job_id}: {command!r} left no job")
                span.set_attributes(
                    {"trainyard.job.state": job.state.value, "trainyard.job.attempt": job.attempt}
                )
                return job
            raise Refused(f"job {job_id} kept changing; gave up after {CONFLICT_RETRIES} tries")


def _job_events(history: Iterable[RecordedEvent]) -> Iterator[JobEvent]:
    for recorded in history:
        yield job_event(recorded)
