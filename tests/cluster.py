"""A test cluster in one process: the control plane's projections, a job service, and real
node agents (process runtime, fake GPUs) against the test's database."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

from controlplane.composition import projection_runner
from controlplane.database import DATABASE_ERRORS
from controlplane.events.metadata import Metadata
from controlplane.events.records import ORIGIN, LogPosition
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.images import ImageAllowlist
from controlplane.jobs.lifecycle import Job, JobStatus
from controlplane.jobs.locations import Roots
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.service import Jobs
from controlplane.logs.store import read_lines
from harness.agent_login import agent_login_url
from harness.served import until_registered
from node_agent.agent import AgentConfig
from node_agent.service import run_agent

USER = Metadata(actor="tenant:acme", tenant="acme")
TEST_IMAGES = "trainyard-learner:latest,trainyard-test-*,trainyard-no-such-image,img,i"
"""The images the tests name, allowed as an operator would allow them (TRAINYARD_IMAGES): to
every control plane and agent the tests start (see conftest.py)."""
A_WHOLE_RUN = [
    JobStatus.QUEUED,
    JobStatus.DEPLOYING,
    JobStatus.DOWNLOADING,
    JobStatus.PROCESSING,
    JobStatus.STORING,
    JobStatus.COMPLETED,
]
"""The states of a job that ran once, start to end."""
LAST_COMMITTED = """
SELECT xid::text::bigint AS xid, position FROM events ORDER BY xid DESC, position DESC LIMIT 1
"""


class Plane:
    """The control plane's background work (projections) and a job service, in-process."""

    def __init__(self, pool: asyncpg.Pool, store: EventStore, db_url: str) -> None:
        self.url = db_url
        self.pool = pool
        self.store = store
        self.jobs = Jobs(store)
        self.listener = LogListener(db_url, poll_interval=0.2)
        self.runner = projection_runner(pool, store, self.listener)

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

    async def projected(self, name: str = "jobs") -> None:
        """Until projection `name` has applied every event committed so far. Not the log's
        tail (`log_tail`), which is what is readable now: an event committed behind a
        transaction still running (the projections' own round, in the background) is not yet,
        and a wait for the tail missed it."""
        row = await self.pool.fetchrow(LAST_COMMITTED)
        last = ORIGIN if row is None else LogPosition(row["xid"], row["position"])
        await self.runner.wait_applied(name, last)

    async def state(self, job_id: UUID, *states: JobStatus) -> Job:
        return await self.until(job_id, lambda job: job.state in states)

    async def log_text(self, job_id: UUID) -> list[str]:
        return [stored.line.text for stored in await read_lines(self.pool, job_id, limit=10_000)]


def learner_space() -> Path:
    """A directory that learners running as users of their own can pass through, outside
    pytest's: pytest makes its own 0700 again whenever a session starts (any session of this
    machine's user), which would lock a running test's learners out of their folders. Removed
    when the test run ends."""
    path = Path(tempfile.mkdtemp(prefix="trainyard-learners-"))
    path.chmod(0o711)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def agent_config(tmp_path: Path, name: str = "n1", grace_s: float = 5) -> AgentConfig:
    """An agent for which the test's directory is the operator's data and results root, working
    in a directory its learners can reach (see `learner_space`)."""
    return AgentConfig(
        roots=Roots(data=(str(tmp_path),), results=(str(tmp_path),)),
        name=name,
        work_dir=learner_space() / name,
        cpus=4,
        memory_mb=8192,
        launcher=(sys.executable, "-m", "runners.launch"),
        heartbeat_s=0.5,
        ttl_s=5,
        grace_s=grace_s,
        poll_s=0.2,
        images=ImageAllowlist.parse(TEST_IMAGES),
    )


class RunningAgent:
    """An agent logged in as operators set agents up: as an agent login, not the owner."""

    def __init__(self, url: str, config: AgentConfig, fake_gpus: int) -> None:
        self.config = config
        self.stop = asyncio.Event()
        self.registered = asyncio.Event()
        self.task = asyncio.create_task(self._run(url, config, fake_gpus))

    async def _run(self, url: str, config: AgentConfig, fake_gpus: int) -> None:
        login = await agent_login_url(url, config.name)
        await run_agent(
            login, config, fake_gpus=fake_gpus, stop=self.stop, registered=self.registered
        )

    async def started(self) -> RunningAgent:
        await until_registered(self.task, self.registered)
        return self

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 30)
