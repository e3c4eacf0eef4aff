"""Why a job is pending, as its front ends ask: the view of its reasons now and in a window
of its history, and what a follower of its reasons is sent as they change.

The facade of the pending feature (see `controlplane.jobs.application`): it takes the job its
caller may see and parsed instants, and answers with `pending.views` models."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from controlplane.jobs.lifecycle import Job
from controlplane.jobs.service import Jobs
from controlplane.pending.views import PendingNow, PendingView, pending_view
from controlplane.refusals import Refusal, Refused


class PendingApplication:
    def __init__(self, jobs: Jobs, pool: asyncpg.Pool) -> None:
        self._jobs = jobs
        self._pool = pool

    async def view(
        self, job: Job, *, since: datetime | None = None, until: datetime | None = None
    ) -> PendingView:
        """The job's reasons now, and its history with each reason's time in [since, until]."""
        if since and until and until < since:
            raise Refusal(Refused.MALFORMED, "until must not be before since", field="until")
        return await pending_view(self._pool, job, self._jobs.clock.now(), since=since, until=until)

    async def now(self, job: Job) -> PendingNow:
        """The job's reasons now, without their history (what a follower is sent)."""
        return (await pending_view(self._pool, job, self._jobs.clock.now())).now()

    async def reload(self, job: Job) -> Job:
        """The job as it stands now (as `job` was, should it be gone)."""
        return await self._jobs.load(job.job_id) or job
