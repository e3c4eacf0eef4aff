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
        departed: list[tuple[UUID, int, datetime]] = []
        for recorded in events:
            event = recorded.event
            match event:
                case JobDeploying() | JobProcessing() | JobCompleted() | JobFailed():
                    departed.append((job_of_stream(recorded.stream_id), event.attempt, event.at))
                case JobCancelled():
                    departed.append((job_of_stream(recorded.stream_id), ENDED, event.at))
                case PendingReasonsChanged():
                    # The departures before it first: it may be of an attempt that left.
                    await _depart(conn, departed)
                    departed = []
                    await _change(conn, job_id_of(recorded.stream_id), event)
        await _depart(conn, departed)


async def _depart(conn: Executor, departed: Sequence[tuple[UUID, int, datetime]]) -> None:
    # One statement for a batch's departures, however many: a claim's costs one row here.
    if departed:
        jobs, attempts, instants = zip(*departed, strict=True)
        await conn.execute(Q["pending_departed"], list(jobs), list(attempts), list(instants))


async def _change(conn: Executor, job_id: UUID, event: PendingReasonsChanged) -> None:
    left_at = await conn.fetchval(Q["pending_left_at"], job_id, event.attempt)
    if left_at is not None and event.at >= left_at:
        return  # judged from a snapshot of before its claim, appended after: nothing held it
    kinds = [r.reason.value for r in event.reasons]
    await conn.execute(Q["pending_close_spans"], job_id, event.at, kinds, event.attempt, left_at)
    if event.reasons:
        await conn.execute(
            Q["pending_open_spans"],
            job_id,
            event.at,
            event.attempt,
            kinds,
            [r.blocking.value for r in event.reasons],
            [r.detail for r in event.reasons],
            left_at,
        )
