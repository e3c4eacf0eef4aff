"""The `jobs` projection: `job_status` (one row per job, its folded state) and `job_history`
(every event of every job with the state it left, its time, actor and reason)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from controlplane.database import Executor
from controlplane.events.store import RecordedEvent
from controlplane.jobs.events import (
    JobCancelled,
    JobEvent,
    JobFailed,
    JobRestarted,
    JobSubmitted,
)
from controlplane.jobs.lifecycle import Job, evolve
from controlplane.jobs.streams import CATEGORY, job_id_of
from controlplane.queries import Q


class JobsProjection:
    name = "jobs"
    tables: Sequence[str] = ("job_status", "job_history")

    async def apply(self, conn: Executor, event: RecordedEvent) -> None:
        if event.category != CATEGORY or not isinstance(event.event, JobEvent):
            return
        job_id = job_id_of(event.stream_id)
        doc = await conn.fetchval(Q["job_doc"], job_id)
        job = evolve(Job.model_validate_json(doc) if doc else None, event.event)
        await conn.execute(
            Q["upsert_job_status"],
            job.job_id,
            job.tenant,
            job.manifest.name,
            job.state.value,
            job.attempt,
            job.restarts,
            job.manifest.priority,
            json.dumps(job.manifest.labels),
            job.submitted_at,
            job.updated_at,
            event.stream_version,
            job.model_dump_json(),
            job.not_before,
        )
        if isinstance(event.event, JobSubmitted | JobRestarted):
            # The job is claimable once this batch commits: wake the agents then (a NOTIFY is
            # delivered at commit, and Postgres sends one per transaction however many).
            await conn.execute(Q["notify_events"])
        await conn.execute(
            Q["insert_job_history"],
            job.job_id,
            event.stream_version,
            event.position,
            event.event.type_name,
            job.state.value,
            job.attempt,
            event.event.at,
            event.metadata.actor,
            reason(event.event),
        )


def reason(event: JobEvent) -> str | None:
    """Why the event happened, for the events that say."""
    if isinstance(event, JobFailed | JobCancelled | JobRestarted):
        return event.reason
    return None
