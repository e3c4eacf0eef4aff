"""The agent port answered by Postgres: the control plane's own services and named queries
(controlplane/*/queries.sql), on the agent's pool."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

import asyncpg

from controlplane.agent_port.values import (
    Allocation,
    BatchCall,
    ClaimedTask,
    ExpiredFolders,
    InferenceJob,
    JobNews,
    QueryClaim,
    TaskResults,
    WarmUid,
)
from controlplane.agents.claims import Releases, claim
from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import NodeAddress, Nodes, NodeSpec, Renewal
from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.deployments.tasks import MAX_TRIES as MAX_TASK_TRIES
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.inference.progress import MAX_TRIES as MAX_QUERY_TRIES
from controlplane.invariants import InvariantBroken
from controlplane.jobs.events import JobEvent
from controlplane.jobs.lifecycle import Command, Job
from controlplane.jobs.service import Jobs
from controlplane.jobs.streams import job_stream
from controlplane.logs import store as log_store
from controlplane.logs.lines import LogLine, Stream
from controlplane.queries import Q
from controlplane.scheduling.claim import Claim


class PostgresPort:
    """One per agent, on its pool (which it does not close)."""

    def __init__(self, pool: asyncpg.Pool, clock: Clock = SYSTEM_CLOCK) -> None:
        self.pool = pool
        self._clock = clock
        self._store = EventStore(pool, EVENT_REGISTRY)
        self._jobs = Jobs(self._store, clock)
        self._nodes = Nodes(pool, self._store, clock)
        self._releases: dict[str, Releases] = {}
        """Per node: a node's releases asked for together go in one statement."""

    # Lease

    async def register(self, node: NodeSpec, ttl_s: float) -> datetime:
        return await self._nodes.register(node, ttl_s)

    async def renew(self, name: str, agent_id: UUID, ttl_s: float) -> Renewal | None:
        return await self._nodes.renew(name, agent_id, ttl_s)

    async def mark_unhealthy(self, name: str, gpu: GpuInfo) -> None:
        await self._nodes.mark_unhealthy(name, gpu)

    async def deregister(self, name: str, agent_id: UUID) -> None:
        await self._nodes.deregister(name, agent_id)

    async def node_addresses(self, names: Sequence[str]) -> dict[str, NodeAddress]:
        return await self._nodes.addresses(names)

    # Job claims

    async def claim(self, node: str, *, uids: range | None) -> list[Claim]:
        return await claim(self.pool, self._store, node, clock=self._clock, uids=uids)

    async def release(self, node: str, job_id: UUID, attempt: int) -> None:
        releases = self._releases.get(node)
        if releases is None:
            releases = self._releases[node] = Releases(self.pool, node)
        await releases.release(job_id, attempt)

    async def allocations(self, node: str) -> list[Allocation]:
        rows = await self.pool.fetch(Q["node_allocations"], node)
        return [
            Allocation(
                r["job_id"], r["attempt"], r["learner"], r["node"], r["epoch"], list(r["gpus"])
            )
            for r in rows
        ]

    # Job commands

    async def current(self, job_id: UUID) -> tuple[Job | None, int]:
        return await self._jobs.current(job_id)

    async def execute(self, job_id: UUID, command: Command, actor: str) -> Job:
        return await self._jobs.execute(job_id, command, Metadata.capture(actor))

    async def news(self, job_id: UUID, after: int) -> list[JobNews]:
        news = []
        for recorded in await self._store.read_stream(job_stream(job_id), from_version=after + 1):
            if not isinstance(recorded.event, JobEvent):
                raise InvariantBroken(f"job {job_id}: {recorded.event!r} in its stream")
            news.append(JobNews(recorded.stream_version, recorded.event))
        return news

    async def secret_env(self, job_id: UUID) -> dict[str, str]:
        secrets = await self.pool.fetchval(Q["job_secret_env"], job_id)
        env: dict[str, str] = json.loads(secrets) if secrets is not None else {}
        return env

    # Logs

    async def write_lines(self, lines: Sequence[LogLine]) -> int:
        return await log_store.write_lines(self.pool, lines)

    async def log_usage(self, job_id: UUID) -> tuple[int, int]:
        return await log_store.log_usage(self.pool, job_id)

    async def last_seqs(self, job_id: UUID, attempt: int) -> dict[tuple[int, Stream], int]:
        return await log_store.last_seqs(self.pool, job_id, attempt)

    # Folders and uids

    async def record_folders(
        self, job_id: UUID, node: str, uid: int | None, checkpoints: UUID
    ) -> None:
        await self.pool.execute(Q["record_job_folders"], job_id, node, uid, checkpoints)

    async def expired_folders(self, node: str) -> list[ExpiredFolders]:
        rows = await self.pool.fetch(Q["expired_job_folders"], node)
        return [
            ExpiredFolders(r["job_id"], r["uid"], r["checkpoints"], r["checkpoints_used"])
            for r in rows
        ]

    async def forget_folders(self, job_id: UUID, node: str) -> None:
        await self.pool.execute(Q["forget_job_folders"], job_id, node)

    async def allocate_uid(self, job_id: UUID, uids: range) -> int | None:
        uid: int | None = await self.pool.fetchval(
            Q["allocate_learner_uid"], job_id, uids.start, len(uids)
        )
        return uid

    async def hold_warm_uid(self, node: str, uids: range) -> WarmUid | None:
        row = await self.pool.fetchrow(Q["hold_warm_uid"], node, uids.start, len(uids))
        return None if row is None else WarmUid(row["placeholder"], row["uid"])

    async def adopt_warm_uid(
        self, job_id: UUID, node: str, placeholder: UUID, checkpoints: UUID
    ) -> int | None:
        uid: int | None = await self.pool.fetchval(
            Q["adopt_warm_uid"], job_id, node, placeholder, checkpoints
        )
        return uid

    async def release_warm_uids(self, node: str, placeholders: Sequence[UUID] | None = None) -> int:
        given = None if placeholders is None else list(placeholders)
        released: int = await self.pool.fetchval(Q["release_warm_uids"], node, given)
        return released

    # Serving

    async def claim_tasks(
        self,
        tenant: str,
        deployment: str,
        most_items: int,
        claim: UUID,
        replica: UUID,
        known: Sequence[UUID],
    ) -> list[ClaimedTask]:
        rows = await self.pool.fetch(
            Q["claim_tasks"], tenant, deployment, most_items, claim, replica, list(known)
        )
        return [ClaimedTask(r["task_id"], r["items"], r["input"], float(r["age_ms"])) for r in rows]

    async def finish_tasks(self, results: TaskResults) -> int:
        calls = results.calls or (
            BatchCall(results.items, results.invocation_ms, results.inference_ms),
        )
        recorded: int = await self.pool.fetchval(
            Q["finish_tasks"],
            results.task_ids,
            results.outputs,
            results.errors,
            results.claim,
            [uuid.uuid4() for _ in calls],
            results.tenant,
            results.deployment,
            results.invocation_ms,
            results.inference_ms,
            results.replica,
            [call.items for call in calls],
            results.reason,
            "failed" if any(results.errors) else "succeeded",
            [call.invocation_ms for call in calls],
            [call.inference_ms for call in calls],
        )
        return recorded

    async def requeue_replica(self, replica: UUID) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(Q["requeue_replica"], replica, MAX_TASK_TRIES)
            await conn.execute(Q["give_back_queries"], replica, MAX_QUERY_TRIES)

    async def offer_channel(
        self, replica: UUID, tenant: str, deployment: str, node: str, address: str, token: str
    ) -> None:
        await self.pool.execute(
            Q["offer_channel"], replica, tenant, deployment, node, address, token
        )

    async def withdraw_channel(self, replica: UUID) -> None:
        await self.pool.execute(Q["withdraw_channel"], replica)

    async def inference_job(self, job_id: UUID) -> InferenceJob | None:
        row = await self.pool.fetchrow(Q["inference_job"], job_id)
        return None if row is None else InferenceJob(row["input"], row["batch_size"])

    async def claim_query(
        self, job_id: UUID, replica: UUID, claim: UUID, node: str, present_s: float
    ) -> QueryClaim:
        row = await self.pool.fetchrow(Q["claim_query"], job_id, replica, claim, node, present_s)
        return QueryClaim(None, "wait") if row is None else QueryClaim(row["index"], row["outcome"])

    async def finish_query(
        self,
        job_id: UUID,
        index: int,
        output: str | None,
        error: str | None,
        inference_ms: float | None,
        claim: UUID,
    ) -> int:
        recorded: int = await self.pool.fetchval(
            Q["finish_query"], job_id, index, output, error, inference_ms, claim
        )
        return recorded

    async def replica_present(self, job_id: UUID, replica: UUID) -> None:
        await self.pool.execute(Q["replica_present"], job_id, replica)

    async def record_load_error(self, job_id: UUID, error: str) -> None:
        await self.pool.execute(Q["record_load_error"], job_id, error)
