"""An operator's drain: a node taken out of service for maintenance, and put back.

A draining node keeps its lease, but claims place nothing on it (the `node_capacity` view
leaves it out), and its agent, which reads the flag back with each renewal of its lease,
preempts every job it runs there as its own stop does: the learners are asked to checkpoint
within their grace, then stopped, and their jobs go back to the queue without spending a
restart. The agent keeps its lease and claims again once the node is undrained. The flag
outlives the agent (a re-registration keeps it); the node's stream records who drained it,
and why."""

from __future__ import annotations

import logging

import asyncpg

from controlplane.agents.events import NodeDrained, NodeUndrained
from controlplane.agents.nodes import Nodes
from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.events.store import EventStore
from controlplane.queries import Q
from controlplane.refusals import Refusal, Refused

log = logging.getLogger(__name__)


class Drains:
    def __init__(self, pool: asyncpg.Pool, store: EventStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self._pool = pool
        self._clock = clock
        self._nodes = Nodes(pool, store, clock)

    async def drain(self, name: str, actor: str, reason: str | None) -> bool:
        """Take the node out of service; whether this call did (False: it was draining
        already, and nothing is written). Refusal (not found) for an unknown node."""
        event = NodeDrained(actor=actor, reason=reason, at=self._clock.now())
        return await self._set(name, event)

    async def undrain(self, name: str, actor: str) -> bool:
        """Put the node back in service; whether this call did (False: it was not draining).
        Refusal (not found) for an unknown node."""
        return await self._set(name, NodeUndrained(actor=actor, at=self._clock.now()))

    async def _set(self, name: str, event: NodeDrained | NodeUndrained) -> bool:
        draining = isinstance(event, NodeDrained)
        async with self._pool.acquire() as conn, conn.transaction():
            # Locked: the flag and the event that says who set it change together.
            row = await conn.fetchrow(Q["lock_node"], name)
            if row is None:
                raise Refusal(Refused.NOT_FOUND, f"no node named {name!r}")
            if row["draining"] == draining:
                return False
            await conn.execute(Q["set_node_draining"], name, draining)
            await self._nodes.record(conn, name, event, event.actor)
        if draining:
            log.warning("node %s drained by %s: its jobs go back to the queue", name, event.actor)
        else:
            log.info("node %s undrained by %s: it takes work again", name, event.actor)
        return True
