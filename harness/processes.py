"""A cluster of real processes on one database, for the recovery benchmark and the chaos tests
to kill: control plane replicas (`trainyard serve`), node agents (`trainyard agent`, process
runtime, one fake GPU each, sharing one checkpoint directory as nodes share a volume) and the
learners those agents start."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID, uuid4

import asyncpg

from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.images import DEFAULT_IMAGES
from controlplane.jobs.lifecycle import Job
from controlplane.jobs.service import Jobs
from controlplane.jobs.streams import job_stream
from controlplane.logs.lines import LogLine
from controlplane.logs.store import read_lines
from controlplane.projections.runner import ProjectionRunner
from controlplane.settings import ARTIFACTS_DIR_ENV
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import create_tenant
from harness.agent_process import AgentProcess
from harness.served import ServedControlPlane
from node_agent.process_runtime import find_learners
from node_agent.runtime import FoundLearner
from trainyard.api import ApiClient

TENANT = "recovery"
PROBE_S = 0.01
"""How often a wait looks again: the resolution of what the benchmark measures."""
BATCH = 1000
WAIT_S = 60.0
"""A bound on how long a broken recovery may hang, never an expectation of how fast it is."""

E = TypeVar("E")
T = TypeVar("T")


def _any(_: object) -> bool:
    return True


def counter(steps: int, step_s: float) -> dict[str, Any]:
    """A manifest of `runners.examples.counter`, which prints `step N` every `step_s` and
    checkpoints every second; with no GPU and one CPU, which its learner gets (cgroups hold a
    learner to its manifest's CPUs in both runtimes): its launcher and its command take
    seconds of CPU to start, which a tenth of a CPU made half a minute."""
    return {
        "name": "counter",
        "image": DEFAULT_IMAGES,
        "command": [
            *(sys.executable, "-m", "runners.examples.counter"),
            *("--steps", str(steps), "--step-s", str(step_s)),
        ],
        "cpus": 1.0,
        "memory_mb": 1024,
        "checkpoint": {"interval_seconds": 1, "keep": 3},
    }


class Cluster:
    def __init__(self, database_url: str, root: Path, pool: asyncpg.Pool, token: str) -> None:
        self.database_url = database_url
        self.root = root
        self.pool = pool
        self.store = EventStore(pool, EVENT_REGISTRY)
        self.jobs = Jobs(self.store)
        self.token = token
        """The bearer token of tenant TENANT."""
        self.planes: list[ServedControlPlane] = []
        self.agents: dict[str, AgentProcess] = {}
        # Unique on this machine: a starting agent kills the learners of its node's name that
        # its database does not know, and other test runs may share the machine.
        self.prefix = f"r{uuid4().hex[:8]}"

    @property
    def artifacts_dir(self) -> Path:
        return self.root / "artifacts"

    async def add_plane(self) -> ServedControlPlane:
        # One model repository folder for every replica and agent, as a fleet shares one.
        plane = ServedControlPlane(
            self.database_url,
            self.root / f"plane-{len(self.planes)}",
            env={ARTIFACTS_DIR_ENV: str(self.artifacts_dir)},
        )
        self.planes.append(plane)
        await plane.start()
        return plane

    async def add_agent(
        self, *, ttl_s: float, heartbeat_s: float, options: tuple[str, ...] = ()
    ) -> AgentProcess:
        """Another agent (`options`: more of `trainyard agent`'s), started."""
        name = f"{self.prefix}-{len(self.agents)}"
        agent = AgentProcess(
            self.database_url,
            self.root / "agents" / name,
            name,
            ttl_s=ttl_s,
            heartbeat_s=heartbeat_s,
            checkpoint_dir=self.root / "checkpoints",
            artifacts_dir=self.artifacts_dir,
            options=options,
        )
        self.agents[name] = agent
        return await agent.start(self.pool)

    async def remove_agent(self, name: str) -> None:
        """Stop the agent `name` (its learners stop, its jobs go back to the queue)."""
        await self.agents.pop(name).stop()

    async def submit(self, manifest: dict[str, Any], plane: ServedControlPlane) -> UUID:
        async with ApiClient(plane.url, self.token) as client:
            job = await client.request("POST", "/v1/jobs", body=manifest)
        return UUID(job["id"])

    async def cancel(self, job_id: UUID, plane: ServedControlPlane) -> None:
        async with ApiClient(plane.url, self.token) as client:
            await client.request("POST", f"/v1/jobs/{job_id}/cancel", body={})

    async def job(self, job_id: UUID) -> Job:
        job = await self.jobs.load(job_id)
        if job is None:
            raise LookupError(f"no job {job_id}")
        return job

    async def until_job(self, job_id: UUID, check: Callable[[Job], bool]) -> Job:
        return await until(lambda: self._job_if(job_id, check))

    async def _job_if(self, job_id: UUID, check: Callable[[Job], bool]) -> Job | None:
        job = await self.jobs.load(job_id)
        return job if job is not None and check(job) else None

    async def event(self, stream: str, kind: type[E], check: Callable[[E], bool] = _any) -> E:
        """The stream's first event of type `kind` that passes `check`, once there is one."""

        async def found() -> E | None:
            for recorded in await self.store.read_stream(stream):
                if isinstance(recorded.event, kind) and check(recorded.event):
                    return recorded.event
            return None

        return await until(found)

    async def job_event(self, job_id: UUID, kind: type[E], check: Callable[[E], bool] = _any) -> E:
        return await self.event(job_stream(job_id), kind, check)

    async def lines(self, job_id: UUID, attempt: int) -> list[LogLine]:
        """Every stored line of the attempt (all learners, both streams), in the order stored."""
        tail = LogTail(self.pool, job_id, attempt)
        lines: list[LogLine] = []
        while batch := await tail.read():
            lines += batch
        return lines

    def live_learners(self) -> list[FoundLearner]:
        """The learners running on the cluster's nodes."""
        return [
            found
            for name, agent in self.agents.items()
            for found in find_learners(name, agent.work_dir)
        ]

    def learners(self, job_id: UUID) -> list[FoundLearner]:
        """The job's live learners on any of the cluster's nodes."""
        return [found for found in self.live_learners() if found.job_id == job_id]

    async def learner(self, job_id: UUID, attempt: int) -> FoundLearner:
        async def running() -> FoundLearner | None:
            found = [f for f in self.learners(job_id) if f.attempt == attempt]
            return found[0] if found else None

        return await until(running)

    async def stop(self) -> None:
        for agent in self.agents.values():
            await agent.stop()
        for plane in self.planes:
            await plane.stop()


@asynccontextmanager
async def cluster(database_url: str, root: Path, pool: asyncpg.Pool) -> AsyncIterator[Cluster]:
    """A cluster with tenant TENANT and nothing running yet; everything it started is stopped
    (learners included) when the block ends."""
    store = EventStore(pool, EVENT_REGISTRY)
    runner = ProjectionRunner(pool, store, LogListener(database_url), [TenantsProjection()])
    issued = await create_tenant(store, runner, TENANT, actor="bench")
    running = Cluster(database_url, root, pool, issued.plaintext)
    try:
        yield running
    finally:
        await running.stop()
        # Learners outlive their agents by design: the ones a killed agent left go too.
        for found in running.live_learners():
            kill_learner(found)


@asynccontextmanager
async def started(
    plane: ServedControlPlane, agents: Sequence[AgentProcess], pool: asyncpg.Pool
) -> AsyncIterator[None]:
    """The control plane, then each agent, started for the block; however it ends, they are
    stopped and the learners they left killed (learners outlive their agents by design). On a
    failure, the end of each agent's log goes to stderr first: what they said, why it stopped."""
    try:
        await plane.start()
        for agent in agents:
            await agent.start(pool)
        yield
    except BaseException:
        for agent in agents:
            if agent.log is not None and agent.log.exists():
                tail = agent.log.read_text(errors="replace")[-3000:]
                print(f"--- {agent.name}'s log, its end:\n{tail}", file=sys.stderr)
        raise
    finally:
        for agent in agents:
            await agent.stop()
        with contextlib.suppress(Exception):
            await plane.stop()
        for agent in agents:
            for found in find_learners(agent.name, agent.work_dir):
                kill_learner(found)


class LogTail:
    """An attempt's stored log lines, read on from where the last read ended."""

    def __init__(self, pool: asyncpg.Pool, job_id: UUID, attempt: int) -> None:
        self._pool = pool
        self._job_id = job_id
        self._attempt = attempt
        self._after = 0

    async def read(self) -> list[LogLine]:
        """The lines stored since the last read (up to a batch)."""
        stored = await read_lines(
            self._pool, self._job_id, attempt=self._attempt, after=self._after, limit=BATCH
        )
        if stored:
            self._after = stored[-1].id
        return [s.line for s in stored]


def kill_learner(found: FoundLearner) -> None:
    """kill -9 the learner: its launcher and the training command (one process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(int(found.handle), signal.SIGKILL)


async def until(check: Callable[[], Awaitable[T | None]]) -> T:
    """Poll `check` every PROBE_S until it returns something other than None, and return that;
    TimeoutError after WAIT_S."""
    async with asyncio.timeout(WAIT_S):
        while True:
            if (value := await check()) is not None:
                return value
            await asyncio.sleep(PROBE_S)


def replica_process(node: str, work_dir: Path, job: UUID) -> int:
    """The pid of a replica job's `runners.serve` process (the launcher's child), as the
    process runtime of the agent of `node` on `work_dir` started it."""
    [launcher] = [f for f in find_learners(node, work_dir) if f.job_id == job]
    [replica] = [
        pid for pid in _children(int(launcher.handle)) if b"runners.serve" in _cmdline(pid)
    ]
    return replica


def _children(parent: int) -> list[int]:
    """The processes whose parent is `parent` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # After the command's name, which may hold spaces and parentheses: state, then ppid.
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""
