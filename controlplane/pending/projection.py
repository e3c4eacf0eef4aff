"""The `pending` projection: `pending_spans`, every span of time a reason held a queued job
back, from the jobs' pending streams and their own streams. A change of reasons ends the spans
of the reasons that no longer hold and begins those of the new ones; the reasons that go on
keep their span. The job's own event that takes an attempt out of the queue (its claim, an
inference job's start, its end) ends that attempt's spans: the recorder appends nothing when a
job leaves, so that a claim costs no event of its own.

The recorder may append a change after the attempt left (it judged a snapshot from before the
claim, or it records changes a little after it shows them, with the instant each happened):
such a change holds the attempt only until it left (`pending_left`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from controlplane.database import Executor
from controlplane.events.records import RecordedEvent
from controlplane.jobs.events import (
    JobCancelled,
    JobCompleted,
    JobDeploying,
    JobFailed,
    JobProcessing,
)
from controlplane.jobs.streams import CATEGORY as JOB_CATEGORY
from controlplane.jobs.streams import job_id_of as job_of_stream
from controlplane.pending.events import PendingReasonsChanged
from controlplane.pending.streams import CATEGORY, job_id_of
from controlplane.queries import Q

ENDED = 2**31 - 1
"""The attempt a job's end is recorded for in `pending_left`: every attempt (a cancel names
none)."""


class PendingProjection:
    name = "pending"
    tables: Sequence[str] = ("pending_spans", "pending_left")
    categories: frozenset[str] | None = frozenset({CATEGORY, JOB_CATEGORY})

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        writes = _Writes(conn)
        for recorded in events:
            event = recorded.event
            match event:
                case JobDeploying() | JobProcessing() | JobCompleted() | JobFailed():
                    await writes.depart(job_of_stream(recorded.stream_id), event.attempt, event.at)
                case JobCancelled():
                    await writes.depart(job_of_stream(recorded.stream_id), ENDED, event.at)
                case PendingReasonsChanged():
                    await writes.change(job_id_of(recorded.stream_id), event)
        await writes.flush()


class _Writes:
    """A batch's writes, gathered: a run of departures is one statement, and a run of changes
    three, however many jobs it holds (a recording round's changes, hundreds in one append,
    were three statements each, which kept the batch's transaction open 100 to 240 ms every
    two seconds with a few thousand jobs queued, holding back every reader of the log). Each
    job's events still take effect in the log's order: departures gathered are written before
    a change that follows them, changes before a departure that follows them, and a job's
    second change or second departure waits for its first to be written. So at most one of
    the two runs is open at a time, and neither holds a job twice."""

    def __init__(self, conn: Executor) -> None:
        self._conn = conn
        self._departed: dict[UUID, tuple[int, datetime]] = {}
        self._changes: dict[UUID, PendingReasonsChanged] = {}

    async def depart(self, job_id: UUID, attempt: int, at: datetime) -> None:
        await self._write_changes()
        if job_id in self._departed:
            await self._write_departures()
        self._departed[job_id] = (attempt, at)

    async def change(self, job_id: UUID, event: PendingReasonsChanged) -> None:
        # The departures before it first: it may be of an attempt that left.
        await self._write_departures()
        if job_id in self._changes:
            await self._write_changes()
        self._changes[job_id] = event

    async def flush(self) -> None:
        await self._write_departures()
        await self._write_changes()

    async def _write_departures(self) -> None:
        # One statement for a run's departures, however many: a claim costs one row here.
        if self._departed:
            departed, self._departed = self._departed, {}
            await self._conn.execute(
                Q["pending_departed"],
                list(departed),
                [attempt for attempt, _ in departed.values()],
                [at for _, at in departed.values()],
            )

    async def _write_changes(self) -> None:
        if not self._changes:
            return
        changes, self._changes = self._changes, {}
        rows = await self._conn.fetch(
            Q["pending_left_of"], list(changes), [e.attempt for e in changes.values()]
        )
        left = {row["job_id"]: row["left_at"] for row in rows}
        # A change judged from a snapshot of before its claim, appended after: nothing held
        # the attempt then.
        held = {
            job_id: event
            for job_id, event in changes.items()
            if left[job_id] is None or event.at < left[job_id]
        }
        if not held:
            return
        jobs = list(held)
        reasons = [(job_id, r) for job_id, event in held.items() for r in event.reasons]
        await self._conn.execute(
            Q["pending_close_spans"],
            jobs,
            [e.at for e in held.values()],
            [e.attempt for e in held.values()],
            [left[job_id] for job_id in jobs],
            [job_id for job_id, _ in reasons],
            [r.reason.value for _, r in reasons],
        )
        if reasons:
            await self._conn.execute(
                Q["pending_open_spans"],
                [job_id for job_id, _ in reasons],
                [held[job_id].attempt for job_id, _ in reasons],
                [r.reason.value for _, r in reasons],
                [r.blocking.value for _, r in reasons],
                [r.detail for _, r in reasons],
                [held[job_id].at for job_id, _ in reasons],
                [left[job_id] for job_id, _ in reasons],
            )
