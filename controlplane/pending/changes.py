"""What a round of the recorder writes, decided purely: for each job, its reasons' row, and an
event where the set of its reasons changed (or it left the queue)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from uuid import UUID

from controlplane.pending.events import PendingReason, PendingReasonsChanged
from controlplane.scheduling.pending import Pending


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


def changes(
    recorded: Mapping[UUID, Recorded], queue: Sequence[Queued], at: datetime
) -> list[Change]:
    """The rows and events that bring `recorded` (every row still queued, and the rows of the
    jobs in `queue`) to `queue`, the reasons of the jobs queued at `at`."""
    out = []
    for job in queue:
        before = recorded.get(job.job_id)
        version = before.version if before else 0
        if (
            before is not None
            and before.queued
            and before.attempt == job.attempt
            and {r.reason for r in before.reasons} == {r.reason for r in job.reasons}
        ):
            # The same reasons: no event, and the row only where what it shows moved.
            shown = (job.position, job.reasons, job.estimated_start)
            if (before.position, before.reasons, before.estimated_start) != shown:
                out.append(Change(_row(job, version, before.since), None, version))
            continue
        event = PendingReasonsChanged(at=at, attempt=job.attempt, reasons=_recorded(job.reasons))
        out.append(Change(_row(job, version + 1, at), event, version))
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
            )
            out.append(Change(row, event, before.version))
    return out


def _recorded(reasons: Sequence[Pending]) -> list[PendingReason]:
    return [PendingReason(reason=r.reason, blocking=r.blocking, detail=r.detail) for r in reasons]


def _row(job: Queued, version: int, since: datetime) -> Recorded:
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
    )
