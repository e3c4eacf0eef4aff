"""What a round of the recorder writes, decided purely: for each job, its reasons' row, and the
events that record in its pending stream the changes of its set of reasons. A round's writes
are bounded, so that a burst or a deep queue is judged and written a part a round rather than
all at once.

A change is shown at once (the row) and recorded (appended, with the instant it happened, its
row's `since`) at most `budget` changes a round, oldest first: a burst of a thousand new jobs
is shown in one statement, and its history follows a chunk a round. A change into `starting`
alone is recorded only once it has lasted STARTING: the next claim ends it within milliseconds,
and a claim must not cost an event of the recorder's (the job's own claim event ends its
spans, see `pending.projection`). A job that leaves the queue gets no event either; a change
of its that is not recorded yet is, then, unless it was such a `starting`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from uuid import UUID

from controlplane.pending.events import PendingReason, PendingReasonsChanged
from controlplane.pending.reasons import Pending, Reason

DETAILS = timedelta(seconds=2)
"""How often a queued job's position, details and estimate are written at most, while its set
of reasons stays the same (a change of reasons is shown at once)."""
STARTING = timedelta(seconds=2)
"""How long a change into `starting` alone must last to be recorded in the job's history;
one that a claim ends sooner is shown in the row only."""
BUDGET = 256
"""How many changes a round records at most (besides those of jobs whose row is overwritten
or leaves the queue, which cannot wait): a round's cost stays bounded in a burst."""
MOVED = 512
"""How many rows whose position, details or estimate alone moved a round writes at most,
those written longest ago first: every claim moves the position of every job behind it, and a
deep queue's rows, all due at once, would be rewritten whole every DETAILS."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """A job's reasons' row as the last round left it."""

    job_id: UUID
    tenant: str
    attempt: int
    version: int
    """Its pending stream's version."""
    queued: bool
    position: int | None
    reasons: tuple[Pending, ...]
    since: datetime
    """When its set of reasons began to hold it."""
    estimated_start: datetime | None = None
    updated_at: datetime | None = None
    """When the row was last written (None: not yet)."""
    recorded: bool = True
    """Its set of reasons is in its pending stream (False: shown, to be recorded)."""


@dataclass(frozen=True, slots=True)
class Queued:
    """A queued job's reasons now."""

    job_id: UUID
    tenant: str
    attempt: int
    position: int
    reasons: tuple[Pending, ...]
    estimated_start: datetime | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """A row to write, with the events to append to its stream first (none: what it shows
    moved, or its change is recorded later or never)."""

    row: Recorded
    events: tuple[PendingReasonsChanged, ...]
    expected_version: int
    """The stream's version the events are appended at."""


@dataclass(frozen=True, slots=True)
class Round:
    changes: list[Change]
    deferred: datetime | None
    """When a round next has something to write though nothing it judges from moves (a row
    left unwritten within DETAILS, a `starting` that lasts, changes over the budget); None
    when nothing."""


def changes(
    recorded: Mapping[UUID, Recorded],
    queue: Sequence[Queued],
    at: datetime,
    *,
    budget: int = BUDGET,
    moved_rows: int = MOVED,
) -> Round:
    """The rows and events that bring `recorded` (every row still queued, and the rows of the
    jobs in `queue`) to `queue`, the reasons of the jobs queued at `at`."""
    rows: dict[UUID, Recorded] = {}
    """The rows to write, as they will be once written."""
    must: dict[UUID, Recorded] = {}
    """Rows whose change, not recorded yet, is overwritten: recorded now or never."""
    deferred: list[datetime] = []
    due_rows: list[tuple[datetime, Queued, Recorded]] = []
    """Rows whose position, details or estimate alone moved, due to be written."""
    for job in queue:
        before = recorded.get(job.job_id)
        if (
            before is not None
            and before.queued
            and before.attempt == job.attempt
            and {r.reason for r in before.reasons} == {r.reason for r in job.reasons}
        ):
            # The same reasons: the row only where what it shows moved, and not more often
            # than every DETAILS: each job that leaves the queue moves the position of every
            # job after it.
            shown = (job.position, job.reasons, job.estimated_start)
            moved = (before.position, before.reasons, before.estimated_start) != shown
            due = at if before.updated_at is None else before.updated_at + DETAILS
            if moved and due <= at:
                due_rows.append((due, job, before))
            elif moved:
                deferred.append(due)
            continue
        if before is not None and before.queued:
            must[job.job_id] = before
        rows[job.job_id] = _row(job, before.version if before else 0, at, at, recorded=False)
    due_rows.sort(key=lambda entry: entry[0])
    for _, job, before in due_rows[:moved_rows]:
        rows[job.job_id] = _row(job, before.version, before.since, at, before.recorded)
    if len(due_rows) > moved_rows:
        deferred.append(at)
    queued = {job.job_id for job in queue}
    for before in recorded.values():
        if before.queued and before.job_id not in queued:
            must[before.job_id] = before
            rows[before.job_id] = replace(
                before,
                queued=False,
                position=None,
                reasons=(),
                since=at,
                estimated_start=None,
                updated_at=at,
                recorded=True,
            )
    events: dict[UUID, list[PendingReasonsChanged]] = {}
    for job_id, before in must.items():
        if not before.recorded and not _passing(before, at):
            events[job_id] = [_event(before)]
    # The changes still to record, oldest first, within what is left of the budget.
    waiting = [
        row
        for row in (rows.get(job_id, before) for job_id, before in recorded.items())
        if row.queued and not row.recorded
    ]
    waiting += [row for job_id, row in rows.items() if job_id not in recorded and row.queued]
    ready = sorted((row for row in waiting if not _passing(row, at)), key=lambda r: r.since)
    left = max(budget - len(events), 0)
    for row in ready[:left]:
        events.setdefault(row.job_id, []).append(_event(row))
        rows[row.job_id] = replace(row, recorded=True, updated_at=at)
    if len(ready) > left:
        deferred.append(at)
    deferred += [row.since + STARTING for row in waiting if _passing(row, at)]
    out = []
    for job_id, row in rows.items():
        appended = tuple(events.get(job_id, ()))
        out.append(Change(replace(row, version=row.version + len(appended)), appended, row.version))
    return Round(out, min(deferred, default=None))


def _passing(row: Recorded, at: datetime) -> bool:
    """A change into `starting` alone, too young to record (a claim ends most within
    milliseconds)."""
    return [r.reason for r in row.reasons] == [Reason.STARTING] and at - row.since < STARTING


def _event(row: Recorded) -> PendingReasonsChanged:
    reasons = [
        PendingReason(reason=r.reason, blocking=r.blocking, detail=r.detail) for r in row.reasons
    ]
    return PendingReasonsChanged(at=row.since, attempt=row.attempt, reasons=reasons)


def _row(job: Queued, version: int, since: datetime, at: datetime, recorded: bool) -> Recorded:
    return Recorded(
        job.job_id,
        job.tenant,
        job.attempt,
        version,
        True,
        job.position,
        job.reasons,
        since,
        job.estimated_start,
        at,
        recorded,
    )
