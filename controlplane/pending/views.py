"""What the API shows of a job's pending reasons: those holding it now, with its queue
position, and its history, each reason's spans and the time it held the job in a window."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from uuid import UUID

from pydantic import BaseModel, Field

from controlplane.database import Executor
from controlplane.instants import Instant
from controlplane.jobs.lifecycle import Job, JobStatus
from controlplane.pending.reasons import Blocking, Reason
from controlplane.queries import Q

_REASON = (
    "no_nodes (no node is READY), unschedulable (no live node could ever hold it), "
    "gpu_unhealthy (one would, were its GPUs healthy), quota (its tenant's GPU quota; `never` "
    "when the job alone exceeds it), backoff (a restart's backoff), resources (no READY node "
    "has room now: the detail names what is short), fair_share (jobs of other tenants come "
    "first), priority (its tenant's jobs of higher priority come first), starting (nothing "
    "holds it: the next claim takes it), replicas (an inference job waiting for its replicas)"
)
_BLOCKING = (
    "never: it will not run as it is (the cluster, the job or the quota must change); waiting: "
    "it waits for its turn, for room, or for a backoff's end"
)


class HeldBy(BaseModel):
    """A reason holding the job now."""

    reason: Reason = Field(description=_REASON)
    blocking: Blocking = Field(description=_BLOCKING)
    detail: str
    since: Instant | None = Field(description="when this reason began to hold it")


class HeldSpan(BaseModel):
    """A span of time a reason held the job."""

    attempt: int
    reason: Reason = Field(description=_REASON)
    blocking: Blocking = Field(description=_BLOCKING)
    detail: str = Field(description="what it said when it began")
    started: Instant = Field(alias="from")
    until: Instant | None = Field(description="null while it still holds")
    seconds: float


class PendingNow(BaseModel):
    """Why the job is pending now: what a `pending` event of its stream carries."""

    job_id: UUID
    state: JobStatus
    attempt: int
    position: int | None = Field(
        description="its place in the queue, 1 first, in the claims' order (fair share, "
        "priority, submission); null unless QUEUED"
    )
    reasons: list[HeldBy] = Field(
        description="every reason holding it now (none unless QUEUED); at least one while it is"
    )
    estimated_start: Instant | None = Field(
        description="when it should start, as the running jobs give their room back at their "
        "expected ends (the median run time of their tenant's recent COMPLETED jobs of the same "
        "name); null when it can start now, or when an end it waits for is unknown"
    )
    updated_at: Instant | None = Field(description="when the recorder last changed these reasons")


class PendingView(PendingNow):
    """Why the job is pending now, and the history of its reasons."""

    history: list[HeldSpan] = Field(
        description="every span a reason held the job, oldest first, every attempt"
    )
    seconds: dict[Reason, float] = Field(
        description="each reason's time holding the job within [since, until]"
    )

    def now(self) -> PendingNow:
        """The view without its history: what changes only when the reasons do (the history's
        open spans and the seconds grow every round)."""
        return PendingNow.model_validate(self.model_dump(include=set(PendingNow.model_fields)))


async def pending_view(
    db: Executor,
    job: Job,
    now: datetime,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
) -> PendingView:
    """The job's reasons now (none unless it is QUEUED and the recorder has judged this
    attempt), and every span of its history; `seconds` adds up each reason's time within
    [since, until] (default: all of it, up to now)."""
    row = await db.fetchrow(Q["pending_now"], job.job_id)
    spans = await db.fetch(Q["pending_spans_of"], job.job_id)
    # The row speaks of now only while it is of this attempt, still queued.
    if row is not None and not (
        row["queued"] and row["attempt"] == job.attempt and job.state is JobStatus.QUEUED
    ):
        row = None
    opened = {
        s["reason"]: s["started_at"]
        for s in spans
        if s["ended_at"] is None and s["attempt"] == job.attempt
    }
    reasons = []
    if row is not None:
        for reason in json.loads(row["reasons"]):
            # The span's start where the projection has it yet, else the row's change.
            since_ = opened.get(reason["reason"], row["since"])
            reasons.append(HeldBy.model_validate({**reason, "since": since_}))
    end = min(until or now, now)
    seconds: dict[Reason, float] = defaultdict(float)
    history = []
    for s in spans:
        stop = s["ended_at"] or now
        history.append(
            HeldSpan.model_validate(
                {
                    "attempt": s["attempt"],
                    "reason": s["reason"],
                    "blocking": s["blocking"],
                    "detail": s["detail"],
                    "from": s["started_at"],
                    "until": s["ended_at"],
                    "seconds": (stop - s["started_at"]).total_seconds(),
                }
            )
        )
        start = max(s["started_at"], since) if since else s["started_at"]
        if min(stop, end) > start:
            seconds[Reason(s["reason"])] += (min(stop, end) - start).total_seconds()
    return PendingView(
        job_id=job.job_id,
        state=job.state,
        attempt=job.attempt,
        position=row["position"] if row is not None else None,
        reasons=reasons,
        estimated_start=row["estimated_start"] if row is not None else None,
        updated_at=row["updated_at"] if row is not None else None,
        history=history,
        seconds=dict(sorted(seconds.items())),
    )
