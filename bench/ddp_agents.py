"""The agents `trainyard bench ddp` runs its jobs on: one, or two acting as two nodes.

- `OneAgent`: a real agent in this process (process runtime; sandboxed, each job's learners in a
  network namespace of their own, when it runs as root) on the agent port's in-memory twin
  (`MemoryPort`: the control plane's side is not what the figures measure).
- `TwoAgents` (`--nodes 2`, root only): two real `trainyard agent` processes, each in a network
  namespace of its own made on this machine (`harness.node_pair`: two nodes joined by a veth
  pair), on a scratch database of the configured Postgres (the agents reach it by its Unix
  socket, or its address), with their node addresses (`--node-address`), one CPU each, so that
  every job of two learners has one on each node and meets across them through the job's
  network (`node_agent.job_links`); a shared checkpoint folder, as a fleet's NFS.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol
from uuid import UUID

import asyncpg

from controlplane.agent_port.memory import MemoryPort
from controlplane.agent_port.wakes import LogListener, polling
from controlplane.composition import projection_runner
from controlplane.database import create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.images import IMAGES_ENV, ImageAllowlist
from controlplane.jobs.lifecycle import Job, JobStatus
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.service import Jobs
from controlplane.logs.lines import LogLine
from controlplane.logs.store import read_lines
from controlplane.tenants.service import create_tenant
from harness.agent_process import AgentProcess
from harness.node_pair import NODE_ADDRESSES, in_ns, node_pair
from harness.served import until_registered
from node_agent.agent import AgentConfig
from node_agent.learners import learner_dir
from node_agent.service import run_agent_on

TENANT = "bench"
IMAGE = "trainyard-learner:latest"
JOB_TIMEOUT_S = 300.0
POLL_S = 0.02
LINES_MOST = 1_000_000
"""More lines than any job of the benchmark writes."""


class BenchFailed(RuntimeError):
    """A job of the benchmark did not end as it must (its log's last lines say why)."""


def manifest(command: list[str], learners: int) -> JobManifest:
    return JobManifest.model_validate(
        {
            "name": f"ddp-{learners}",
            "image": IMAGE,
            "command": command,
            "learners": learners,
            "cpus": 1,
            "rendezvous_timeout_s": 60,
        }
    )


class Agents(Protocol):
    """Where the benchmark's jobs run, and what it reads of them."""

    nodes: int

    async def submit(self, command: list[str], learners: int) -> UUID: ...

    async def job(self, job_id: UUID) -> Job | None: ...

    async def lines(self, job_id: UUID) -> list[LogLine]:
        """The job's stored lines, in the order they were stored."""
        ...

    def weights_path(self, job: Job) -> Path:
        """Where rank 0 of the job's attempt left its final weights."""
        ...


async def until(agents: Agents, job_id: UUID, done: Callable[[Job], bool], what: str) -> Job:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        job = await agents.job(job_id)
        if job is not None and done(job):
            return job
        if job is not None and job.state in (JobStatus.FAILED, JobStatus.CANCELLED):
            tail = await _tail(agents, job_id)
            raise BenchFailed(f"job {job_id} {job.state.value} before {what}: {tail}")
        await asyncio.sleep(POLL_S)
    raise BenchFailed(
        f"job {job_id}: not {what} within {JOB_TIMEOUT_S:g} s: {await _tail(agents, job_id)}"
    )


async def completed(agents: Agents, job_id: UUID) -> Job:
    return await until(agents, job_id, lambda job: job.state is JobStatus.COMPLETED, "COMPLETED")


async def _tail(agents: Agents, job_id: UUID) -> list[str]:
    return [line.text for line in await agents.lines(job_id)][-8:]


class OneAgent:
    """One agent in this process, on the in-memory twin."""

    nodes = 1

    def __init__(self, work: Path, cpus: int) -> None:
        self.port = MemoryPort()
        self.config = AgentConfig(
            name="bench-ddp",
            work_dir=work / "agent",
            cpus=float(cpus),
            memory_mb=8192,
            launcher=(sys.executable, "-m", "runners.launch"),
            heartbeat_s=0.5,
            ttl_s=5,
            grace_s=10,
            poll_s=0.1,
            images=ImageAllowlist.parse(IMAGE),
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[OneAgent]:
        stop, registered = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(
            run_agent_on(
                self.port,
                polling(self.config.poll_s),
                self.config,
                fake_gpus=0,
                stop=stop,
                registered=registered,
            )
        )
        try:
            await until_registered(task, registered)
            yield self
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)

    async def submit(self, command: list[str], learners: int) -> UUID:
        return self.port.submit(TENANT, manifest(command, learners))

    async def job(self, job_id: UUID) -> Job | None:
        return self.port.job(job_id)

    async def lines(self, job_id: UUID) -> list[LogLine]:
        return self.port.lines(job_id)

    def weights_path(self, job: Job) -> Path:
        return learner_dir(self.config.work_dir, job.job_id, job.attempt, 0) / "weights.pt"


class TwoAgents:
    """Two `trainyard agent` processes as two nodes, on a scratch database."""

    nodes = 2

    def __init__(self, database: str, work: Path) -> None:
        self._database = database
        self._work = {node: work / f"node-{node}" for node in NODE_ADDRESSES}
        self._checkpoints = work / "checkpoints"
        self._pool: asyncpg.Pool | None = None
        self._jobs: Jobs | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[TwoAgents]:
        pool = await create_pool(self._database, min_size=1, max_size=4)
        store = EventStore(pool, EVENT_REGISTRY)
        listener = LogListener(self._database, poll_interval=0.1)
        runner = projection_runner(pool, store, listener)
        background = [asyncio.create_task(listener.run()), asyncio.create_task(runner.run())]
        try:
            await create_tenant(store, runner, TENANT, actor="bench")
            self._pool, self._jobs = pool, Jobs(store)
            with node_pair(self._work) as names, _environment(IMAGES_ENV, IMAGE):
                agents = [
                    AgentProcess(
                        self._database,
                        self._work[node],
                        f"bench-ddp-{node}",
                        checkpoint_dir=self._checkpoints,
                        fake_gpus=0,
                        prefix=tuple(in_ns(names[node])),
                        options=("--node-address", address, "--cpus", "1", "--poll", "0.1"),
                        log=self._work[node].parent / f"agent-{node}.log",
                    )
                    for node, address in NODE_ADDRESSES.items()
                ]
                try:
                    for agent in agents:
                        await agent.start(pool)
                    yield self
                finally:
                    for agent in agents:
                        await agent.stop()
        finally:
            runner.stop()
            listener.stop()
            listener.wake()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await pool.close()

    async def submit(self, command: list[str], learners: int) -> UUID:
        assert self._jobs is not None, "not running"
        metadata = Metadata(actor=f"tenant:{TENANT}", tenant=TENANT)
        job, _ = await self._jobs.submit(TENANT, manifest(command, learners), metadata)
        return job.job_id

    async def job(self, job_id: UUID) -> Job | None:
        assert self._jobs is not None, "not running"
        return await self._jobs.load(job_id)

    async def lines(self, job_id: UUID) -> list[LogLine]:
        assert self._pool is not None, "not running"
        stored = await read_lines(self._pool, job_id, limit=LINES_MOST)
        return [each.line for each in stored]

    def weights_path(self, job: Job) -> Path:
        for work in self._work.values():
            path = learner_dir(work, job.job_id, job.attempt, 0) / "weights.pt"
            if path.exists():
                return path
        raise BenchFailed(f"job {job.job_id}: rank 0 left no weights on either node")


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """`name` set for the agents this process starts (their image allowlist)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
