"""The hints the `jobs` projection sends node agents: a claimable job on one channel, what
running learners must act on (or learners placed on other nodes) on another, and nothing for
the learners' progress reports, which are most of a busy log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from uuid import UUID

import asyncpg
import pytest

from controlplane.clock import SYSTEM_CLOCK
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.events import (
    CheckpointRequested,
    CheckpointSaved,
    DeploymentRolledBack,
    JobCancelled,
    JobCompleted,
    JobDeploying,
    JobDownloading,
    JobFailed,
    JobProcessing,
    JobRestarted,
    JobStoring,
    JobSubmitted,
    LearnersExited,
    LearnersReachedPhase,
)
from controlplane.jobs.lifecycle import (
    Cancel,
    Command,
    Complete,
    Deploy,
    EnterPhase,
    Fail,
    JobStatus,
    RequestCheckpoint,
    Restart,
    RollBack,
    SaveCheckpoint,
)
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.projection import (
    CLAIMABLE_CHANNEL,
    REQUESTS_CHANNEL,
    JobsProjection,
    requested,
)
from controlplane.jobs.service import Jobs
from controlplane.projections.runner import ProjectionRunner
from tests.polling import eventually

META = Metadata(actor="test")
FENCE = "trainyard_test_fence"
"""Notified by the test after a batch committed: notifications reach a listener in the order
their transactions committed, so once this one has, the batch's have too."""
MANIFEST = JobManifest.model_validate(
    {"name": "j", "image": "img", "command": ["train"], "learners": 2, "max_restarts": 5}
)


class Hints:
    """The agents' two channels, heard the way an agent hears them."""

    def __init__(self, listener: LogListener, owner: asyncpg.Connection) -> None:
        self._listener = listener
        self._owner = owner
        self._heard = (0, 0)

    async def since_last(self) -> tuple[int, int]:
        """(claimable, requests) notifications delivered since the last call."""
        fenced = self._listener.notified(FENCE)
        await self._owner.execute(f"NOTIFY {FENCE}")

        async def delivered() -> bool:
            return self._listener.notified(FENCE) > fenced

        await eventually(delivered, seconds=5)
        heard = (
            self._listener.notified(CLAIMABLE_CHANNEL),
            self._listener.notified(REQUESTS_CHANNEL),
        )
        since = (heard[0] - self._heard[0], heard[1] - self._heard[1])
        self._heard = heard
        return since


@pytest.fixture
async def hints(db_url: str, owner: asyncpg.Connection) -> AsyncIterator[Hints]:
    listener = LogListener(
        db_url, channel=CLAIMABLE_CHANNEL, also=(REQUESTS_CHANNEL, FENCE), poll_interval=60
    )
    task = asyncio.create_task(listener.run())
    await asyncio.wait_for(listener.connected.wait(), 5)
    yield Hints(listener, owner)
    listener.stop()
    await asyncio.wait_for(task, 5)


STEPS: list[tuple[Callable[[datetime], Command], tuple[int, int]]] = [
    # (what happens to the job, then (claimable, requests) hints its batch sends)
    (lambda at: Deploy(["n1"], ["GPU-0", "GPU-1"], 1, at), (0, 0)),  # its claimer starts it
    (lambda at: EnterPhase(JobStatus.DOWNLOADING, at), (0, 0)),
    (lambda at: EnterPhase(JobStatus.PROCESSING, at), (0, 0)),
    (lambda at: SaveCheckpoint(1, "/ckpt/1", 10, 0.1, at), (0, 0)),
    (lambda at: RequestCheckpoint(at), (0, 1)),
    (lambda at: Restart("node n1 lost", at), (1, 1)),
    (lambda at: Deploy(["n1", "n2"], ["GPU-0", "GPU-2"], 2, at), (0, 1)),  # n2 starts its part
    (lambda at: RollBack("a learner did not start", at), (1, 1)),
    (lambda at: Deploy(["n2"], ["GPU-2", "GPU-3"], 3, at), (0, 0)),
    (lambda at: Fail("exit 1", at, exit_code=1), (0, 1)),
]


async def test_each_batch_wakes_agents_only_for_what_concerns_them(
    pool: asyncpg.Pool, store: EventStore, db_url: str, hints: Hints
) -> None:
    runner = ProjectionRunner(pool, store, LogListener(db_url), [JobsProjection()])
    projection = runner.projections["jobs"]
    jobs = Jobs(store)

    async def project() -> tuple[int, int]:
        """The hints sent while the projection applied what the log holds (a transaction open
        anywhere on the server may hold the newest events back for a moment)."""

        async def applied() -> bool:
            await runner.catch_up(projection)
            return await runner.caught_up()

        await eventually(applied)
        return await hints.since_last()

    job, _ = await jobs.submit("acme", MANIFEST, META)
    assert await project() == (1, 0)
    for step, sent in STEPS:
        command = step(SYSTEM_CLOCK.now())
        await jobs.execute(job.job_id, command, META)
        assert await project() == sent, command

    # A batch of claimable jobs and requests sends both (one of each, in one transaction,
    # unless a transaction held some of the events back for the next batch).
    other = await _running(jobs)
    for _ in range(3):
        await jobs.submit("acme", MANIFEST, META)
    await jobs.execute(other, Cancel("enough", SYSTEM_CLOCK.now()), META)
    claimable, requests = await project()
    assert claimable >= 1 and requests >= 1

    # Every learner's report of a run that goes well: not a hint to anyone.
    done = await _running(jobs)
    await project()
    for report in (
        EnterPhase(JobStatus.STORING, SYSTEM_CLOCK.now()),
        Complete([0, 0], SYSTEM_CLOCK.now()),
    ):
        await jobs.execute(done, report, META)
    assert await project() == (0, 0)


async def _running(jobs: Jobs) -> UUID:
    """A job of two learners on n1, PROCESSING."""
    job, _ = await jobs.submit("acme", MANIFEST, META)
    at = SYSTEM_CLOCK.now()
    for command in (
        Deploy(["n1"], ["GPU-0", "GPU-1"], 1, at),
        EnterPhase(JobStatus.DOWNLOADING, at),
        EnterPhase(JobStatus.PROCESSING, at),
    ):
        await jobs.execute(job.job_id, command, META)
    return job.job_id


def test_requests_are_what_agents_act_on_for_running_learners_or_other_nodes() -> None:
    at = SYSTEM_CLOCK.now()
    job = UUID(int=1)

    def deploying(*nodes: str) -> JobDeploying:
        return JobDeploying(at=at, attempt=1, nodes=list(nodes), gpus=[], epoch=1)

    acted_on = [
        JobCancelled(at=at, reason="r"),
        CheckpointRequested(at=at),
        JobRestarted(at=at, reason="r", attempt=2, resume_from=None),
        DeploymentRolledBack(at=at, reason="r", attempt=2),
        JobFailed(at=at, attempt=1, reason="r"),
        deploying("n1", "n2"),
    ]
    progress = [
        JobSubmitted(job_id=job, at=at, tenant="acme", manifest=MANIFEST),
        deploying("n1"),
        JobDownloading(at=at, attempt=1),
        JobProcessing(at=at, attempt=1),
        LearnersReachedPhase(at=at, attempt=1, phase="PROCESSING", learners=[0]),
        CheckpointSaved(at=at, attempt=1, step=1, path="/p", size_bytes=1, duration_s=0.1),
        JobStoring(at=at, attempt=1),
        LearnersExited(at=at, attempt=1, learners=[0]),
        JobCompleted(at=at, attempt=1, exit_codes=[0]),
    ]
    assert [requested(event) for event in acted_on] == [True] * len(acted_on)
    assert [requested(event) for event in progress] == [False] * len(progress)
