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
from datetime import datetime
from uuid import NAMESPACE_URL, UUID, uuid5

import asyncpg

from controlplane.agents.claims import Releases, claim
from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import Nodes, NodeSpec
from controlplane.clock import SYSTEM_CLOCK
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.lifecycle import Complete, EnterPhase, JobStatus, Refused
from controlplane.jobs.service import Jobs
from controlplane.queries import Q
from controlplane.scheduling.claim import Claim

NODE_GPUS = 8
TTL_S = 60.0
HEARTBEAT_S = 2.0
"""A real agent's heartbeat interval (`AgentConfig.heartbeat_s`'s default)."""


class Fleet:
    """`nodes` simulated agents on one pool."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        beats: asyncpg.Pool,
        store: EventStore,
        nodes: int,
        run_s: tuple[float, float],
    ) -> None:
        self._pool = pool
        self._store = store
        self._nodes = Nodes(pool, store)
        self._jobs = Jobs(store)
        # Heartbeats on connections of their own, as each agent's are: never queued behind
        # the fleet's claims.
        self._beats = Nodes(beats, store)
        self.names = [f"node-{i}" for i in range(nodes)]
        self._run_s = run_s
        self.claim_s: list[float] = []
        """Each timed claim's duration, empty ones included."""
        self.claimed = 0
        """Jobs the timed claims took."""
        self.timing = False
        """Whether claims are timed now (a claim is timed if it began and ended so)."""
        self.completed = 0
        self.heartbeats = 0
        self.heartbeats_per_s = 0.0
        self._draw = random.Random(0)

    async def register(self) -> None:
        async def one(name: str) -> None:
            gpus = [
                GpuInfo(
                    index=i, uuid=f"GPU-{name}-{i}", model="fake", memory_mb=80_000, healthy=True
                )
                for i in range(NODE_GPUS)
            ]
            spec = NodeSpec(name, agent_id(name), "process", 64, 1 << 20, gpus)
            await self._nodes.register(spec, TTL_S)
            # What an earlier run left allocated here has no learner any more (a bench that
            # died, its nodes declared lost): given back, as a restarted agent would.
            releases = Releases(self._pool, name)
            for row in await self._pool.fetch(Q["node_attempts"], name):
                await releases.release(row["job_id"], row["attempt"])

        await _bounded(one(name) for name in self.names)

    async def deregister(self) -> None:
        await _bounded(self._nodes.deregister(name, agent_id(name)) for name in self.names)

    @asynccontextmanager
    async def heartbeating(self) -> AsyncIterator[None]:
        """Every node renews its lease each HEARTBEAT_S while the block runs."""

        started = time.perf_counter()

        async def beat(name: str) -> None:
            await asyncio.sleep(self._draw.uniform(0, HEARTBEAT_S))
            while True:
                await self._beats.renew(name, agent_id(name), TTL_S)
                self.heartbeats += 1
                await asyncio.sleep(HEARTBEAT_S)

        tasks = [asyncio.create_task(beat(name)) for name in self.names]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.heartbeats_per_s = self.heartbeats / (time.perf_counter() - started)

    async def work(self, listener: LogListener, warmup_s: float, over: asyncio.Event) -> None:
        """Claim, run and finish until `over` is set; then what still runs finishes at once.
        The agents come up over `warmup_s`; claims are timed while `timing` is set.
        `listener` is the agents' wake-up (`CLAIMABLE` hints, and the poll)."""
        async with asyncio.TaskGroup() as group:
            for name in self.names:
                group.create_task(self._agent(name, listener, warmup_s, over))

    async def _agent(
        self, node: str, listener: LogListener, warmup_s: float, over: asyncio.Event
    ) -> None:
        releases = Releases(self._pool, node)
        metadata = Metadata(actor=f"agent:{node}")
        ended = asyncio.Event()
        free = NODE_GPUS
        await asyncio.sleep(self._draw.uniform(0, warmup_s))

        async def learner(won: Claim, gpus: int, run_s: float) -> None:
            nonlocal free
            job_id = won.job.job_id
            # Reports as a learner's launcher does: PROCESSING once started, COMPLETED at its
            # end: after its drawn time, or when the run ends (what still runs finishes then).
            with suppress(Refused):  # the job moved on without it (rolled back, cancelled)
                await self._jobs.execute(job_id, EnterPhase(JobStatus.PROCESSING, now()), metadata)
                with suppress(TimeoutError):
                    async with asyncio.timeout(run_s):
                        await over.wait()
                await self._jobs.execute(job_id, Complete([0] * len(won.learners), now()), metadata)
            await releases.release(job_id, won.attempt)
            free += gpus
            self.completed += 1
            ended.set()

        async with asyncio.TaskGroup() as learners:
            changed = True  # a starting agent claims
            while not over.is_set():
                # As `node_agent.agent` does: after its own learner ended, claim; woken by a
                # claimable job or the poll, claim only with a GPU free.
                if changed or free:
                    while won := await self._claim(node):
                        for taken in won:
                            gpus = sum(len(x.gpus) for x in taken.learners if x.node == node)
                            free -= gpus
                            run_s = self._draw.uniform(*self._run_s)
                            learners.create_task(learner(taken, gpus, run_s))
                seen = listener.generation
                changed = await _first_of(ended, listener.wait(seen), over)

    async def _claim(self, node: str) -> list[Claim]:
        timed = self.timing
        started = time.perf_counter()
        won = await claim(self._pool, self._store, node)
        if timed and self.timing:
            self.claim_s.append(time.perf_counter() - started)
            self.claimed += len(won)
        return won


async def _first_of(ended: asyncio.Event, woken: Awaitable[None], over: asyncio.Event) -> bool:
    """Wait for a learner's end, a wake-up or the run's end; whether a learner ended."""
    waiters = {
        asyncio.ensure_future(ended.wait()),
        asyncio.ensure_future(woken),
        asyncio.ensure_future(over.wait()),
    }
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    changed = ended.is_set()
    ended.clear()
    return changed


def agent_id(node: str) -> UUID:
    """The simulated agent's identity: the same each run, as a real agent keeps it, so that its
    node's lease stays its own."""
    return uuid5(NAMESPACE_URL, f"trainyard-bench-scale/{node}")


def now() -> datetime:
    return SYSTEM_CLOCK.now()


async def _bounded(calls: Iterable[Awaitable[object]], limit: int = 16) -> None:
    """Await `calls`, at most `limit` at a time (the pool's size, not a thousand waiters)."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Awaitable[object]) -> None:
        async with gate:
            await call

    async with asyncio.TaskGroup() as group:
        for call in calls:
            group.create_task(one(call))
