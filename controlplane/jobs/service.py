"""Carrying out job commands against the event store: load, decide, append, retry on conflict."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from itertools import takewhile

from opentelemetry.util.types import Attributes

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.database import Executor
from controlplane.events.errors import ConcurrencyError
from controlplane.events.metadata import Metadata
from controlplane.events.records import RecordedEvent
from controlplane.events.store import EventStore
from controlplane.invariants import InvariantBroken
from controlplane.jobs.events import JobEvent
from controlplane.jobs.lifecycle import JOB, Command, Job, Refused, Submit, decide, replay
from controlplane.jobs.limits import JobLimits
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.streams import job_stream
from controlplane.jobs.tracing import command_span_name, job_root, job_span, tracer
from controlplane.queries import Q

IDEMPOTENCY_NAMESPACE = uuid.UUID("5b0e4c1e-7d2a-4e8a-9f57-3c1d2b9a6e10")
"""Job ids of idempotent submissions are uuid5(namespace, tenant + key): a retry finds its job."""


class IdempotencyMismatch(Exception):
    """An Idempotency-Key reused for a different manifest; nothing was written."""


def idempotent_id(tenant: str, idempotency_key: str) -> uuid.UUID:
    """The id of the job a tenant submits with `idempotency_key`, whichever try creates it."""
    return uuid.uuid5(IDEMPOTENCY_NAMESPACE, f"{tenant}\n{idempotency_key}")


def new_job_id(tenant: str, idempotency_key: str | None) -> uuid.UUID:
    """The id a submission's job gets: a fresh one, or its idempotency key's."""
    return uuid.uuid4() if idempotency_key is None else idempotent_id(tenant, idempotency_key)


class Jobs:
    """Job commands and reads, with the job's own stream as the only truth."""

    def __init__(self, store: EventStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self._store = store
        self.clock = clock
        """What submissions are timed by, and what callers time the commands they build by."""

    async def history(self, job_id: uuid.UUID) -> list[RecordedEvent]:
        return await self._store.read_stream(job_stream(job_id))

    async def current(self, job_id: uuid.UUID) -> tuple[Job | None, int]:
        """The job now, and its stream's version."""
        loaded = await JOB.load(self._store, job_stream(job_id))
        return loaded.state, loaded.version

    async def load(self, job_id: uuid.UUID, *, as_of: datetime | None = None) -> Job | None:
        """The job now, or as it was at `as_of` (None if it did not exist then)."""
        events: Iterable[JobEvent] = JOB.typed(await self.history(job_id))
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
        job_id: uuid.UUID | None = None,
    ) -> tuple[Job, bool]:
        """Submit a job, to run under `limits` (None: the defaults); returns it and whether it
        was created now (False for a retry). Its `secret_env` is stored apart from the event
        log, in the same transaction as the job's first event (a retry keeps the secrets of the
        job it finds)."""
        # Given when the manifest names the job's id (an inference job's deployment does).
        job_id = job_id or new_job_id(tenant, idempotency_key)
        command = Submit(
            job_id=job_id,
            tenant=tenant,
            manifest=manifest,
            at=self.clock.now(),
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

    async def execute(
        self,
        job_id: uuid.UUID,
        command: Command,
        metadata: Metadata,
        *,
        conn: Executor | None = None,
        attributes: Attributes = None,
    ) -> Job:
        """Decide `command` on the job's latest state and append; Refused if illegal. The
        step is a span in the job's trace (with `attributes` besides the job's), and so are
        the events' metadata. With `conn`, inside that connection's transaction and tried once:
        a conflict (ConcurrencyError) is for the caller to retry in a new transaction."""
        stream = job_stream(job_id)
        streams = self._store if conn is None else self._store.on(conn)
        loaded = await JOB.load(streams, stream)
        attributes = {"trainyard.job.id": str(job_id), **(attributes or {})}
        with job_span(command_span_name(command), job_root(loaded.recorded), attributes) as span:
            metadata = metadata.traced()
            if conn is None:
                executed = await JOB.execute(streams, stream, command, metadata, loaded=loaded)
            else:
                executed = await JOB.try_once(streams, stream, command, metadata, loaded=loaded)
            job = executed.state
            if job is None:  # decide refuses every command but Submit on no job
                raise Refused("no such job", not_found=True)
            span.set_attributes(
                {"trainyard.job.state": job.state.value, "trainyard.job.attempt": job.attempt}
            )
            return job
