"""What the API shows of a job's pending reasons: those holding it now, with its queue
position, and its history, each reason's spans and the time it held the job in a window."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from typing import Any

from controlplane.database import Executor
from controlplane.jobs.lifecycle import Job, JobStatus
from controlplane.queries import Q


async def pending_view(
    db: Executor,
    job: Job,
    now: datetime,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
) -> dict[str, Any]:
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
            reasons.append({**reason, "since": _iso(opened.get(reason["reason"], row["since"]))})
    end = min(until or now, now)
    seconds: dict[str, float] = defaultdict(float)
    history = []
    for s in spans:
        stop = s["ended_at"] or now
        history.append(
            {
                "attempt": s["attempt"],
                "reason": s["reason"],
                "blocking": s["blocking"],
                "detail": s["detail"],
                "from": _iso(s["started_at"]),
                "until": _iso(s["ended_at"]),
                "seconds": (stop - s["started_at"]).total_seconds(),
            }
        )
        start = max(s["started_at"], since) if since else s["started_at"]
        if min(stop, end) > start:
            seconds[s["reason"]] += (min(stop, end) - start).total_seconds()
    return {
        "job_id": str(job.job_id),
        "state": job.state.value,
        "attempt": job.attempt,
        "position": row["position"] if row is not None else None,
        "reasons": reasons,
        "estimated_start": _iso(row["estimated_start"]) if row is not None else None,
        "updated_at": _iso(row["updated_at"]) if row is not None else None,
        "history": history,
        "seconds": dict(sorted(seconds.items())),
    }


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None
