"""Retention, the last step of the lifecycle manager's sweep: what an ended job leaves behind
goes once the log retention has passed since it ended: its log lines, then its folders on the
nodes (their agents remove them), then its learner uid (docs/learner-uids.md)."""

from __future__ import annotations

import logging

import asyncpg

from controlplane.queries import Q
from controlplane.settings import LOG_RETENTION_S
from controlplane.sweeps import Tenure

log = logging.getLogger(__name__)

LOG_RETENTION_JOBS = 100
"""Most jobs whose logs one sweep forgets. The sweep also declares lost nodes, so it must stay
short while a first run works through years of history: 100 jobs of 1,000 lines each go in
0.13 s on a developer's machine (1,000 jobs: 0.9 s), and at one sweep a second that still
clears some 300,000 jobs an hour."""


class JobRetention:
    """The sweep of ended jobs past the retention."""

    name = "job-retention"

    def __init__(self, pool: asyncpg.Pool, retention_s: float = LOG_RETENTION_S) -> None:
        """`retention_s`: how long after a job ended its log lines go (0: never)."""
        self._pool = pool
        self._retention_s = retention_s

    async def step(self, tenure: Tenure) -> None:
        if not self._retention_s:
            return
        forgotten = await self._pool.fetchval(
            Q["forget_job_logs"], self._retention_s, LOG_RETENTION_JOBS
        )
        if forgotten:
            log.info("log retention: forgot the logs of %d ended job(s)", forgotten)
        # The same retention for the jobs' folders on the nodes, and then for their uids.
        await self._pool.execute(Q["expire_job_folders"], self._retention_s)
        released = await self._pool.fetchval(Q["release_learner_uids"], self._retention_s)
        if released:
            log.info("retention: %d ended job(s) gave back their learner uids", released)
