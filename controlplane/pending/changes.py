"""What a round of the recorder writes, decided purely: for each job, its reasons' row, and an
event where the set of its reasons changed (or it left the queue)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from uuid import UUID

from controlplane.pending.events import PendingReason, PendingReasonsChanged
from controlplane.pending.reasons import Pending

DETAILS = timedelta(seconds=2)
"""How often a queued job's position, details and estimate are written at most, while its set
of reasons stays the same (a change of reasons is written at once)."""


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
    estimated_start: datetime | None = None
    updated_at: datetime | None = None
    """When the row was last written (None: not yet)."""


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
    """A row to write, with the event to append first (None: its details or position moved,
    its set of reasons did not)."""

    row: Recorded
    event: PendingReasonsChanged | None
    expected_version: int
    """The stream's version the event is appended at."""


@dataclass(frozen=True, slots=True)
class Round:
    changes: list[Change]
    deferred: datetime | None
    """When the first of the rows left unwritten (their details moved within DETAILS) is due;
    None when none was."""


def changes(recorded: Mapping[UUID, Recorded], queue: Sequence[Queued], at: datetime) -> Round:
    """The rows and events that bring `recorded` (every row still queued, and the rows of the
    jobs in `queue`) to `queue`, the reasons of the jobs queued at `at`."""
    out = []
    deferred: datetime | None = None
    for job in queue:
        before = recorded.get(job.job_id)
        version = before.version if before else 0
        if (
            before is not None
            and before.queued
            and before.attempt == job.attempt
            and {r.reason for r in before.reasons} == {r.reason for r in job.reasons}
        ):
            # The same reasons: no event, and the row only where what it shows moved, and not
            # more often than every DETAILS: each job that leaves the queue moves the position
            # of every job after it.
            shown = (job.position, job.reasons, job.estimated_start)
            moved = (before.position, before.reasons, before.estimated_start) != shown
            due = at if before.updated_at is None else before.updated_at + DETAILS
            if moved and due <= at:
                out.append(Change(_row(job, version, before.since, at), None, version))
            elif moved:
                deferred = due if deferred is None else min(deferred, due)
            continue
        event = PendingReasonsChanged(at=at, attempt=job.attempt, reasons=_recorded(job.reasons))
        out.append(Change(_row(job, version + 1, at, at), event, version))
    queued = {job.job_id for job in queue}
    for before in recorded.values():
        if before.queued and before.job_id not in queued:
            event = PendingReasonsChanged(at=at, attempt=before.attempt, reasons=[])
            row = replace(
                before,
                version=before.version + 1,
                queued=False,
                position=None,
                reasons=(),
                since=at,
                estimated_start=None,
                updated_at=at,
            )
            out.append(Change(row, event, before.version))
    return Round(out, deferred)


def _recorded(reasons: Sequence[Pending]) -> list[PendingReason]:
    return [PendingReason(reason=r.reason, blocking=r.blocking, detail=r.detail) for r in reasons]


def _row(job: Queued, version: int, since: datetime, at: datetime) -> Recorded:
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
    )
