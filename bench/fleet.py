"""Many simulated node agents for `trainyard bench scale`: each registers its node (fake GPUs),
renews its lease as a real agent does, claims through the real claim, "runs" what it won for
a drawn time (a fake runtime), reports PROCESSING and COMPLETED through the job lifecycle and
releases the allocation, as `node_agent.agent` does, but all on one event loop and one pool."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import asynccontextmanager, suppress
from uuid import NAMESPACE_URL, UUID, uuid5

import asyncpg

from controlplane.agents.claims import Releases, claim
from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import Nodes, NodeSpec
from controlplane.clock import SYSTEM_CLOCK
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.lifecycle import Complete, EnterPhase, JobStatus, decide, evolve
from controlplane.jobs.streams import job_stream
from controlplane.scheduling.claim import Claim

NODE_GPUS = 8
TTL_S = 60.0
HEARTBEAT_S = 2.0
"""A real agent's heartbeat interval (`AgentConfig.heartbeat_s`'s default)."""
IDLE_POLL_S = 1.0
"""A node that found nothing that fits claims again after this (a real agent is also woken
by NOTIFY; here the learners' ends wake their own node)."""


class Fleet:
    """`nodes` simulated agents on one pool."""

    def __init__(
        self, pool: asyncpg.Pool, store: EventStore, nodes: int, run_s: tuple[float, float]
    ) -> None:
        self._pool = pool
        self._store = store
        self._nodes = Nodes(pool, store)
        self.names = [f"node-{i}" for i in range(nodes)]
        self._run_s = run_s
        self.claim_s: list[float] = []
        """Each claim's duration, empty ones included."""
        self.claimed = 0
        self.completed = 0
        self.heartbeats = 0
        self._draw = random.Random(0)

    def _agent_id(self, name: str) -> UUID:
        # The same identity each run, as a real agent keeps it: its node's lease is its own.
        return uuid5(NAMESPACE_URL, f"trainyard-bench-scale/{name}")

    async def register(self) -> None:
        async def one(name: str) -> None:
            gpus = [
                GpuInfo(
                    index=i, uuid=f"GPU-{name}-{i}", model="fake", memory_mb=80_000, healthy=True
                )
                for i in range(NODE_GPUS)
            ]
            spec = NodeSpec(name, self._agent_id(name), "process", 64, 1 << 20, gpus)
            await self._nodes.register(spec, TTL_S)

        await _bounded(one(name) for name in self.names)

    async def deregister(self) -> None:
        await _bounded(self._nodes.deregister(name, self._agent_id(name)) for name in self.names)

    @asynccontextmanager
    async def heartbeating(self) -> AsyncIterator[None]:
        """Every node renews its lease each HEARTBEAT_S while the block runs."""

        async def beat(name: str) -> None:
            await asyncio.sleep(self._draw.uniform(0, HEARTBEAT_S))
            while True:
                await self._nodes.renew(name, self._agent_id(name), TTL_S)
                self.heartbeats += 1
                await asyncio.sleep(HEARTBEAT_S)

        tasks = [asyncio.create_task(beat(name)) for name in self.names]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def work(self, seconds: float) -> None:
        """Claim, run and finish for `seconds` (starts spread over the first HEARTBEAT_S, as
        agents come up at different times); then finish what still runs, at once."""
        deadline = time.perf_counter() + seconds
        async with asyncio.TaskGroup() as group:
            for name in self.names:
                group.create_task(self._agent(name, deadline))

    async def _agent(self, node: str, deadline: float) -> None:
        releases = Releases(self._pool, node)
        metadata = Metadata(actor=f"agent:{node}")
        ended, over = asyncio.Event(), asyncio.Event()
        await asyncio.sleep(self._draw.uniform(0, HEARTBEAT_S))

        async def learner(won: Claim, run_s: float) -> None:
            # Runs its drawn time, or ends when the run does (what still runs then finishes).
            with suppress(TimeoutError):
                async with asyncio.timeout(run_s):
                    await over.wait()
            job = won.job
            events = decide(EnterPhase(JobStatus.PROCESSING, SYSTEM_CLOCK.now()), job)
            processing = evolve(job, events[0])
            events += decide(Complete([0] * len(won.learners), SYSTEM_CLOCK.now()), processing)
            await self._store.append(job_stream(job.job_id), won.version, events, metadata)
            await releases.release(job.job_id, won.attempt)
            self.completed += 1
            ended.set()

        async with asyncio.TaskGroup() as learners:
            while time.perf_counter() < deadline:
                ended.clear()
                started = time.perf_counter()
                won = await claim(self._pool, self._store, node)
                self.claim_s.append(time.perf_counter() - started)
                self.claimed += len(won)
                for taken in won:
                    learners.create_task(learner(taken, self._draw.uniform(*self._run_s)))
                if won:
                    continue  # a node claims until nothing more fits
                with suppress(TimeoutError):
                    async with asyncio.timeout(min(IDLE_POLL_S, deadline - time.perf_counter())):
                        await ended.wait()
            over.set()


async def _bounded(calls: Iterable[Awaitable[object]], limit: int = 16) -> None:
    """Await `calls`, at most `limit` at a time (the pool's size, not a thousand waiters)."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Awaitable[object]) -> None:
        async with gate:
            await call

    async with asyncio.TaskGroup() as group:
        for call in calls:
            group.create_task(one(call))
