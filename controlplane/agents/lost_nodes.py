"""Lost nodes, the lifecycle manager's first step: a node whose lease expired is declared LOST and
its jobs restarted elsewhere, from their latest checkpoints; its agent, should it come back,
finds its epoch stale and kills what it still runs."""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime
from uuid import UUID

import asyncpg

from controlplane.agents.events import NodeLost
from controlplane.agents.nodes import Nodes
from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.lifecycle import Refused, Restart
from controlplane.jobs.service import Jobs
from controlplane.queries import Q
from controlplane.sweeps import ACTOR, WORKER, Tenure
from controlplane.workers import isolated

log = logging.getLogger(__name__)


class LostNodes:
    """The sweep of expired leases."""

    name = "lost-nodes"

    def __init__(self, pool: asyncpg.Pool, store: EventStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self._pool = pool
        self._clock = clock
        self._nodes = Nodes(pool, store, clock)
        self._jobs = Jobs(store, clock)

    async def step(self, tenure: Tenure) -> None:
        await self.declare_expired(tenure.resumed_at)

    async def declare_expired(self, resumed_at: datetime | None = None) -> list[str]:
        """Declare every node whose lease has expired (counted from `resumed_at` too, see
        `Tenure`) LOST; the names of those this call declared."""
        lost = []
        for row in await self._pool.fetch(Q["expired_nodes"], resumed_at):
            # One node's jobs (their data) stop that node's step only, never the others'.
            if await isolated(WORKER, f"node {row['name']}", self._declare_lost(row["name"])):
                lost.append(row["name"])
        return lost

    async def _declare_lost(self, name: str) -> bool:
        """The node LOST, its jobs' attempts restarted and its allocations (and warm uids)
        released: together (one transaction), so that no job is left on a node that nobody
        runs."""
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
            await conn.execute(Q["release_lost_node_warm_uids"], name)
        log.warning("%s: its jobs go back to the queue", reason)
        return True
