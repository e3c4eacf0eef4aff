"""Node registration, leases and inventory: the control plane's side of an agent's life."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from controlplane.agents.events import (
    GpuInfo,
    NodeDeregistered,
    NodeEvent,
    NodeGpuUnhealthy,
    NodeRegistered,
)
from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.database import Executor
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.failures import CommandFailed
from controlplane.invariants import InvariantBroken
from controlplane.queries import Q

CATEGORY = "node"


class NodeNameTaken(CommandFailed):
    """Another agent holds a live lease on the node's name."""


@dataclass(frozen=True, slots=True)
class Renewal:
    """A lease renewed: until when, and whether an operator drained the node (its agent then
    preempts what it runs there, and claims nothing)."""

    lease_until: datetime
    draining: bool


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    agent_id: UUID
    runtime: str
    cpus: float
    memory_mb: int
    gpus: list[GpuInfo]
    address: str | None = None
    """Its IPv4 address on the cluster network (its agent's `--node-address`): where the other
    nodes route a job's addresses on it (`node_agent.job_links`); None: jobs do not span it."""
    job_plan: str | None = None
    """How its agent numbers jobs' address blocks (`node_agent.job_links.AddressPlan.key`):
    a job spans only nodes that plan alike."""


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """A node's address on the cluster network, and how its agent numbers jobs' blocks."""

    address: str
    job_plan: str | None


def node_stream(name: str) -> str:
    return f"{CATEGORY}-{name}"


class Nodes:
    def __init__(self, pool: asyncpg.Pool, store: EventStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self._pool = pool
        self._store = store
        self._clock = clock

    async def register(self, node: NodeSpec, ttl_s: float) -> datetime:
        """Take the node's lease and record its inventory; NodeNameTaken if it is held."""
        async with self._pool.acquire() as conn, conn.transaction():
            lease = await conn.fetchval(
                Q["register_node"],
                node.name,
                node.agent_id,
                ttl_s,
                node.runtime,
                node.cpus,
                node.memory_mb,
                node.address,
                node.job_plan,
            )
            if lease is None:
                holder = await conn.fetchrow(Q["node_lease_holder"], node.name)
                if holder is None:  # register_node found a live lease, and the row is locked
                    raise InvariantBroken(f"node {node.name}: a live lease without a holder")
                raise NodeNameTaken(
                    f"node name {node.name!r} is held by a live agent ({holder['agent_id']}, "
                    f"lease until {holder['lease_until']:%Y-%m-%d %H:%M:%S%z}); "
                    "stop that agent or choose another --name"
                )
            await conn.execute(Q["forget_node_gpus"], node.name)
            await conn.executemany(
                Q["insert_node_gpu"],
                [
                    (node.name, g.index, g.uuid, g.model, g.memory_mb, g.healthy, g.health_reason)
                    for g in node.gpus
                ],
            )
            registered = NodeRegistered(
                agent_id=node.agent_id,
                runtime=node.runtime,
                cpus=node.cpus,
                memory_mb=node.memory_mb,
                gpus=node.gpus,
                at=self._clock.now(),
            )
            await self.record(conn, node.name, registered)
        if not isinstance(lease, datetime):
            raise InvariantBroken(f"node {node.name}: registered without a lease ({lease!r})")
        return lease

    async def renew(self, name: str, agent_id: UUID, ttl_s: float) -> Renewal | None:
        """Extend the lease; None when it is no longer this agent's."""
        row = await self._pool.fetchrow(Q["renew_lease"], name, agent_id, ttl_s)
        if row is None:
            return None
        if not isinstance(row["lease_until"], datetime):
            raise InvariantBroken(f"node {name}: a lease that is not a time ({row!r})")
        return Renewal(row["lease_until"], row["draining"])

    async def addresses(self, names: Sequence[str]) -> dict[str, NodeAddress]:
        """The recorded addresses of the nodes `names` that have one."""
        rows = await self._pool.fetch(Q["node_addresses"], list(names))
        return {row["name"]: NodeAddress(row["address"], row["job_plan"]) for row in rows}

    async def mark_unhealthy(self, name: str, gpu: GpuInfo) -> None:
        reason = gpu.health_reason or "unhealthy"
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(Q["lock_node"], name)  # see `record`
            await conn.execute(Q["set_gpu_health"], name, gpu.uuid, False, reason)
            await self.record(
                conn, name, NodeGpuUnhealthy(uuid=gpu.uuid, reason=reason, at=self._clock.now())
            )

    async def deregister(self, name: str, agent_id: UUID) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(Q["deregister_node"], name, agent_id)
            await self.record(conn, name, NodeDeregistered(agent_id=agent_id, at=self._clock.now()))

    async def record(
        self, conn: Executor, name: str, event: NodeEvent, actor: str | None = None
    ) -> None:
        """Append to the node's stream inside the caller's transaction, which also holds the
        node's row: every writer of the stream (its agent, the lifecycle manager, an operator's
        drain) holds it first, so its version cannot move. `actor`: the agent's, unless
        given."""
        stream = node_stream(name)
        version = await self._store.version(stream, conn=conn)
        metadata = Metadata.capture(actor or f"agent:{name}")
        await self._store.append(stream, version, [event], metadata, conn=conn)
