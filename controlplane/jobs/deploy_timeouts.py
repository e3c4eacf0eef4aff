"""Deploy timeouts, a step of the lifecycle manager's sweep: a job is deployed whole or not at
all, so an attempt whose learners did not all start within its deploy timeout is rolled back
(its nodes stop the learners that did start, and give their GPUs back) and retried, or FAILED
(see `RollBack` in the job's lifecycle)."""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.lifecycle import Refused, RollBack
from controlplane.jobs.service import Jobs
from controlplane.jobs.streams import job_stream
from controlplane.queries import Q
from controlplane.sweeps import ACTOR, WORKER, Tenure
from controlplane.workers import isolated

log = logging.getLogger(__name__)


class DeployTimeouts:
    """The sweep of attempts stuck DEPLOYING."""

    name = "deploy-timeouts"

    def __init__(self, pool: asyncpg.Pool, store: EventStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self._pool = pool
        self._clock = clock
        self._jobs = Jobs(store, clock)

    async def step(self, tenure: Tenure) -> None:
        for row in await self._pool.fetch(Q["stalled_deployments"]):
            roll_back = self._roll_back(row["job_id"], row["attempt"], row["timeout_s"])
            # One job's data stops that job's rollback only, never the other jobs'.
            await isolated(WORKER, f"job {row['job_id']}", roll_back)

    async def _roll_back(self, job_id: UUID, attempt: int, timeout_s: float) -> None:
        job, _ = await self._jobs.current(job_id)
        if job is None or job.attempt != attempt:
            return  # restarted meanwhile: the projection that listed it lagged
        waiting = [n for n in range(job.manifest.learners) if n not in job.learner_phases]
        reason = (
            f"deploy_timeout: learner(s) {', '.join(map(str, waiting))} had not started "
            f"within {timeout_s:g}s"
        )
        metadata = Metadata.capture(ACTOR, causation_id=job_stream(job_id))
        try:
            # A step of the job's trace like every other command; refused when the attempt
            # moved on meanwhile (it started after all, say): the next sweep looks again.
            await self._jobs.execute(
                job_id, RollBack(reason, self._clock.now(), attempt=attempt), metadata
            )
        except Refused:
            return
        log.warning("job %s: %s; deployment rolled back", job_id, reason)
