"""The node agent end to end: real Postgres, real child processes, fake GPUs."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from controlplane.agents.nodes import NodeNameTaken
from controlplane.database import DATABASE_ERRORS
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.lifecycle import Cancel, Job, JobStatus, RequestCheckpoint
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.service import Jobs, now
from controlplane.logs.store import read_lines
from controlplane.projections.catalog import all_projections
from controlplane.projections.runner import ProjectionRunner
from controlplane.tenants.service import create_tenant
from node_agent.agent import AgentConfig
from node_agent.service import run_agent
from tests.polling import eventually

USER = Metadata(actor="tenant:acme", tenant="acme")


class Plane:
    """The control plane's background work (projections) and a job service, in-process."""

    def __init__(self, pool: asyncpg.Pool, store: EventStore, db_url: str) -> None:
        self.url = db_url
        self.pool = pool
        self.store = store
        self.jobs = Jobs(store)
        self.listener = LogListener(db_url, poll_interval=0.2)
        self.runner = ProjectionRunner(pool, store, self.listener, all_projections())

    async def submit(self, command: list[str], **extra: Any) -> UUID:
        manifest = JobManifest.model_validate(
            {"name": "t", "image": "img", "command": command, "gpus_per_learner": 1, **extra}
        )
        job, _ = await self.jobs.submit("acme", manifest, USER)
        return job.job_id

    async def until(self, job_id: UUID, check: Callable[[Job], bool], seconds: float = 30) -> Job:
        async with asyncio.timeout(seconds):
            while True:
                # The test's own connections may be cut too (see the database-loss test).
                with contextlib.suppress(*DATABASE_ERRORS):
                    job = await self.jobs.load(job_id)
                    if job is not None and check(job):
                        return job
                await asyncio.sleep(0.05)

    async def state(self, job_id: UUID, *states: JobStatus) -> Job:
        return await self.until(job_id, lambda job: job.state in states)

    async def log_text(self, job_id: UUID) -> list[str]:
        return [stored.line.text for stored in await read_lines(self.pool, job_id, limit=10_000)]


@pytest.fixture
async def plane(pool: asyncpg.Pool, store: EventStore, db_url: str) -> AsyncIterator[Plane]:
    plane = Plane(pool, store, db_url)
    await create_tenant(store, plane.runner, "acme", actor="test")
    tasks = [asyncio.create_task(plane.listener.run()), asyncio.create_task(plane.runner.run())]
    yield plane
    plane.runner.stop()
    plane.listener.stop()
    plane.listener.wake()
    await asyncio.wait(tasks, timeout=5)


def config(tmp_path: Path, name: str = "n1", grace_s: float = 5) -> AgentConfig:
    return AgentConfig(
        name=name,
        work_dir=tmp_path / name,
        cpus=4,
        memory_mb=8192,
        launcher=(sys.executable, "-m", "runners.launch"),
        heartbeat_s=0.5,
        ttl_s=5,
        grace_s=grace_s,
        poll_s=0.2,
    )


class RunningAgent:
    def __init__(self, url: str, config: AgentConfig, fake_gpus: int) -> None:
        self.stop = asyncio.Event()
        self.registered = asyncio.Event()
        self.task = asyncio.create_task(
            run_agent(url, config, fake_gpus=fake_gpus, stop=self.stop, registered=self.registered)
        )

    async def started(self) -> RunningAgent:
        done, _ = await asyncio.wait(
            {self.task, asyncio.ensure_future(self.registered.wait())},
            timeout=10,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if self.task in done:
            self.task.result()  # raises what stopped it
        return self

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 30)


@pytest.fixture
async def agent(plane: Plane, tmp_path: Path) -> AsyncIterator[RunningAgent]:
    running = await RunningAgent(plane.url, config(tmp_path), fake_gpus=2).started()
    yield running
    await running.finish()


PRINT_GPUS = [
    sys.executable,
    "-c",
    "import os; print('gpus=' + os.environ['CUDA_VISIBLE_DEVICES'])",
]


async def test_a_job_runs_to_completion_on_its_own_gpu_with_its_logs(
    plane: Plane, agent: RunningAgent, owner: asyncpg.Connection
) -> None:
    job_id = await plane.submit(PRINT_GPUS)
    job = await plane.state(job_id, JobStatus.COMPLETED)
    assert job.exit_codes == [0]
    assert [t.state for t in job.transitions] == [
        JobStatus.QUEUED,
        JobStatus.DEPLOYING,
        JobStatus.DOWNLOADING,
        JobStatus.PROCESSING,
        JobStatus.STORING,
        JobStatus.COMPLETED,
    ]
    assert len(job.gpus) == 1 and job.nodes == ["n1"]
    await wait_for_line(plane, job_id, f"gpus={job.gpus[0]}")  # exactly its GPU is visible
    # The GPU went back.
    assert await owner.fetchval("SELECT count(*) FROM allocated_gpus") == 0


async def test_two_jobs_never_share_the_node_s_gpus(plane: Plane, agent: RunningAgent) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(1)"]
    jobs = [await plane.submit(sleeper) for _ in range(3)]
    finished = [await plane.state(j, JobStatus.COMPLETED) for j in jobs]
    assert all(len(job.gpus) == 1 for job in finished)
    # Two GPUs, three jobs: the third waited for a free GPU; the two that overlapped differed.
    starts = sorted(finished, key=lambda job: job.transitions[1].at)
    assert starts[0].gpus != starts[1].gpus


async def test_a_failing_command_fails_the_job_with_its_exit_code(
    plane: Plane, agent: RunningAgent
) -> None:
    job_id = await plane.submit(
        [sys.executable, "-c", "print('about to fail'); raise SystemExit(3)"]
    )
    job = await plane.state(job_id, JobStatus.FAILED)
    assert job.exit_codes == [3]
    assert job.failure_reason is not None and "exited with code 3" in job.failure_reason
    await wait_for_line(plane, job_id, "about to fail")


async def test_a_command_that_cannot_start_fails_with_the_error(
    plane: Plane, agent: RunningAgent
) -> None:
    job_id = await plane.submit(["no-such-program-anywhere", "--flag"])
    job = await plane.state(job_id, JobStatus.FAILED)
    assert job.failure_reason is not None and "no-such-program-anywhere" in job.failure_reason
    await wait_for_line(plane, job_id, "no-such-program-anywhere")


SLEEPER = [
    sys.executable,
    "-c",
    "import signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *_: print('checkpoint requested', flush=True))\n"
    "signal.signal(signal.SIGTERM, lambda *_: (print('terminating', flush=True), sys.exit(0)))\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(0.05)\n",
]


async def wait_for_line(plane: Plane, job_id: UUID, text: str) -> None:
    async def logged() -> bool:
        with contextlib.suppress(*DATABASE_ERRORS):
            return any(text in line for line in await plane.log_text(job_id))
        return False

    await eventually(logged)


async def test_checkpoint_requests_and_cancel_reach_the_learner(
    plane: Plane, agent: RunningAgent, owner: asyncpg.Connection
) -> None:
    job_id = await plane.submit(SLEEPER)
    await plane.state(job_id, JobStatus.PROCESSING)
    await wait_for_line(plane, job_id, "ready")
    await plane.jobs.execute(job_id, RequestCheckpoint(at=now()), USER)
    await wait_for_line(plane, job_id, "checkpoint requested")
    await plane.jobs.execute(job_id, Cancel(reason="enough", at=now()), USER)
    await wait_for_line(plane, job_id, "terminating")  # SIGTERM, within the grace period

    async def released() -> bool:
        return not await owner.fetchval("SELECT count(*) FROM allocated_gpus")

    await eventually(released)
    assert (await plane.state(job_id, JobStatus.CANCELLED)).failure_reason is None


async def test_a_name_held_by_a_live_agent_is_refused(
    plane: Plane, agent: RunningAgent, tmp_path: Path
) -> None:
    with pytest.raises(NodeNameTaken, match="held by a live agent"):
        await RunningAgent(plane.url, config(tmp_path), fake_gpus=1).started()


async def test_stopping_the_agent_sends_running_jobs_back_to_the_queue(
    plane: Plane, tmp_path: Path
) -> None:
    running = await RunningAgent(plane.url, config(tmp_path, grace_s=5), fake_gpus=1).started()
    job_id = await plane.submit(SLEEPER)
    await plane.state(job_id, JobStatus.PROCESSING)
    await wait_for_line(plane, job_id, "ready")
    await running.finish()
    job = await plane.state(job_id, JobStatus.QUEUED)
    assert job.attempt == 2 and job.restarts == 1
    assert job.transitions[-1].reason == "node agent stopped"
    await wait_for_line(plane, job_id, "terminating")


async def test_losing_the_database_keeps_learners_running_and_catches_up(
    plane: Plane, agent: RunningAgent, owner: asyncpg.Connection
) -> None:
    counter = [
        sys.executable,
        "-c",
        "import time\nfor i in range(30):\n    print(f'tick {i}', flush=True); time.sleep(0.1)",
    ]
    job_id = await plane.submit(counter)
    await plane.state(job_id, JobStatus.PROCESSING)
    # Every connection to the database but ours is cut: the agent's pool, its LISTEN
    # connection, the log shipper's, and the control plane's.
    cut = await owner.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    assert cut > 0
    job = await plane.state(job_id, JobStatus.COMPLETED)
    assert job.attempt == 1  # the learner was never restarted
    await wait_for_line(plane, job_id, "tick 29")
    ticks = [line for line in await plane.log_text(job_id) if line.startswith("tick")]
    assert ticks == [f"tick {i}" for i in range(30)]  # every line, once, in order
