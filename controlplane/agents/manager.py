"""The lifecycle manager: exactly one control plane replica at a time declares nodes whose
lease expired LOST and restarts their jobs elsewhere, from their latest checkpoints, rolls
back deployments whose learners did not all start within their deploy timeout, and forgets
the logs of jobs that ended longer ago than the log retention."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from datetime import datetime
from uuid import UUID

import asyncpg

from controlplane.agents.events import NodeLost
from controlplane.agents.nodes import Nodes
from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.database import DATABASE_ERRORS, DatabaseUnavailable, connect
from controlplane.deployments.errors import ServingError
from controlplane.deployments.service import Deployments
from controlplane.deployments.tasks import MAX_TRIES
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.inference.service import Inference
from controlplane.jobs.lifecycle import Refused, Restart, RollBack
from controlplane.jobs.service import Jobs
from controlplane.jobs.streams import job_stream
from controlplane.queries import Q
from controlplane.settings import LOG_RETENTION_S
from controlplane.workers import isolated, pause

log = logging.getLogger(__name__)

ACTOR = "system:lifecycle-manager"
WORKER = "lifecycle-manager"
TASK_RETENTION_S = 24 * 3600.0
"""How long finished serving tasks (and their batches) are kept: their results readable, their
figures counted."""
LOG_RETENTION_JOBS = 100
"""Most jobs whose logs one sweep forgets. The sweep also declares lost nodes, so it must stay
short while a first run works through years of history: 100 jobs of 1,000 lines each go in
0.13 s on a developer's machine (1,000 jobs: 0.9 s), and at one sweep a second that still
clears some 300,000 jobs an hour."""


class LifecycleManager:
    """Every replica runs one; the one holding the manager lock is active, the others stand by
    and take over within one interval of its death (its lock ends with its session)."""

    def __init__(
        self,
        url: str,
        pool: asyncpg.Pool,
        store: EventStore,
        *,
        deployments: Deployments | None = None,
        inference: Inference | None = None,
        interval_s: float = 1.0,
        clock: Clock = SYSTEM_CLOCK,
        task_retention_s: float = TASK_RETENTION_S,
        log_retention_s: float = LOG_RETENTION_S,
    ) -> None:
        """`log_retention_s`: how long after a job ended its log lines go (0: never)."""
        self._url = url
        self._pool = pool
        self._clock = clock
        self._nodes = Nodes(pool, store, clock)
        self._jobs = Jobs(store, clock)
        self._deployments = deployments
        self._inference = inference
        self._task_retention_s = task_retention_s
        self._log_retention_s = log_retention_s
        self.interval_s = interval_s
        self.active = False
        self._stopping = asyncio.Event()
        self._session_lost = False
        self._leases_from: datetime | None = None
        """When this manager last took the lock after losing its session to the database:
        leases count their TTL from then too, so that a node whose agent could not heartbeat
        while the database moved (a failover) is not declared LOST for it."""

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._hold_lock_and_sweep()
            except (DatabaseUnavailable, *DATABASE_ERRORS) as exc:
                # DatabaseUnavailable: no server took the connection (the primary is down, or
                # a failover is under way); raised, it would end every background task.
                log.warning("lifecycle manager: %s; retrying", exc)
                self._session_lost = True
            self.active = False
            await pause(self._stopping, self.interval_s)

    async def _hold_lock_and_sweep(self) -> None:
        conn = await connect(self._url)
        try:
            while not self._stopping.is_set():
                if not self.active:
                    self.active = bool(await conn.fetchval(Q["manager_lock"]))
                    if self.active:
                        log.info("lifecycle manager: active")
                        if self._session_lost:
                            self._leases_from = await conn.fetchval(Q["database_now"])
                            self._session_lost = False
                # Sweep at once on taking over: a node may have expired while nobody swept.
                if self.active:
                    # Still holding the lock only while this session lives: check it first.
                    # (Should it die just after, two replicas may sweep at once for a moment;
                    # a sweep is transactional and conditional, so neither repeats the other.)
                    await conn.fetchval(Q["ping"])
                    await self.sweep()
                await pause(self._stopping, self.interval_s)
        finally:
            await asyncio.shield(conn.close(timeout=5))

    async def sweep(self) -> list[str]:
        """Declare every node whose lease has expired LOST (returns their names), then roll
        back deployments that did not start in time, and forget logs past their retention (and
        the folders and uids of the jobs past it)."""
        lost = []
        for row in await self._pool.fetch(Q["expired_nodes"], self._leases_from):
            if await isolated(WORKER, f"node {row['name']}", self._declare_lost(row["name"])):
                lost.append(row["name"])
        for row in await self._pool.fetch(Q["stalled_deployments"]):
            roll_back = self._roll_back(row["job_id"], row["attempt"], row["timeout_s"])
            await isolated(WORKER, f"job {row['job_id']}", roll_back)
        if self._deployments is not None:
            await self._serve(self._deployments)
        if self._inference is not None:
            # Each inference job's step is isolated inside (see `Inference.sweep`).
            await self._inference.sweep()
        if self._log_retention_s:
            forgotten = await self._pool.fetchval(
                Q["forget_job_logs"], self._log_retention_s, LOG_RETENTION_JOBS
            )
            if forgotten:
                log.info("log retention: forgot the logs of %d ended job(s)", forgotten)
            # The same retention for the jobs' folders on the nodes (their agents remove them),
            # and then for their uids (docs/learner-uids.md).
            await self._pool.execute(Q["expire_job_folders"], self._log_retention_s)
            released = await self._pool.fetchval(Q["release_learner_uids"], self._log_retention_s)
            if released:
                log.info("retention: %d ended job(s) gave back their learner uids", released)
        return lost

    async def _serve(self, deployments: Deployments) -> None:
        """Replace replicas that stopped answering (their tasks go back to the queue, or fail
        after MAX_TRIES), keep every deployment's replicas what it asks for, fail tasks left
        to a deleted deployment, bound the memo, and forget tasks past their retention."""
        stalled = await self._pool.fetch(Q["stalled_tasks"], MAX_TRIES)
        for row in {(r["tenant"], r["deployment"], r["replica"]): r for r in stalled}.values():
            reason = f"unresponsive: held a task past its {row['timeout_s']:g}s timeout"
            log.warning(
                "deployment %s/%s: replica %s %s",
                row["tenant"],
                row["deployment"],
                row["replica"],
                reason,
            )
            retire = deployments.retire(row["tenant"], row["deployment"], row["replica"], reason)
            await _isolated(f"deployment {row['tenant']}/{row['deployment']}", retire)
        for row in await self._pool.fetch(Q["live_deployments"]):
            reconcile = deployments.reconcile(row["tenant"], row["name"])
            await _isolated(f"deployment {row['tenant']}/{row['name']}", reconcile)
        await self._pool.execute(Q["fail_orphaned_tasks"])
        await self._pool.execute(Q["evict_memo"])
        await self._pool.execute(Q["forget_tasks"], self._task_retention_s)

    async def _roll_back(self, job_id: UUID, attempt: int, timeout_s: float) -> None:
        """A deployment whose learners did not all start in time is rolled back (its nodes stop
        the learners that did start, and give their GPUs back) and retried, or FAILED."""
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

    async def _declare_lost(self, name: str) -> bool:
        """The node LOST, its jobs' attempts restarted and its allocations released: together
        (one transaction), so that no job is left on a node that nobody runs."""
        at = self._clock.now()
        reason = f"node_lost: node {name} stopped renewing its lease"
        async with self._pool.acquire() as conn, conn.transaction():
            agent_id: UUID | None = await conn.fetchval(Q["mark_node_lost"], name)
            if agent_id is None:
                return False  # it renewed in time after all, or another manager was first
            await self._nodes.record(conn, name, NodeLost(agent_id=agent_id, reason=reason, at=at))
            metadata = Metadata.capture(ACTOR, causation_id=f"node-{name}")
            attempts = await conn.fetch(Q["node_attempts"], name)
            attributes = {"trainyard.node": name, "trainyard.reason": reason}
            for row in attempts:
                restart = Restart(reason, at, attempt=row["attempt"])
                # A step of the job's trace, in this transaction: should another append to the
                # job's stream win meanwhile, the whole of this node's sweep rolls back. Refused:
                # finished, cancelled or already restarted meanwhile.
                with contextlib.suppress(Refused):
                    await self._jobs.execute(
                        row["job_id"], restart, metadata, conn=conn, attributes=attributes
                    )
            await conn.execute(
                Q["release_allocations"],
                [row["job_id"] for row in attempts],
                [row["attempt"] for row in attempts],
                name,
            )
        log.warning("%s: its jobs go back to the queue", reason)
        return True


async def _isolated(what: str, step: Awaitable[object]) -> None:
    """A deployment's step of the sweep: its refusal is logged, its failure recorded (see
    `workers.isolated`), and neither stops the sweep for the nodes, the jobs and the other
    deployments."""
    await isolated(WORKER, what, _refusal_logged(what, step))


async def _refusal_logged(what: str, step: Awaitable[object]) -> None:
    # A refusal (the deployment was deleted, scaled meanwhile) is the next sweep's to see
    # again: no failure of the worker.
    try:
        await step
    except ServingError as exc:
        log.warning("%s: %s", what, exc)
