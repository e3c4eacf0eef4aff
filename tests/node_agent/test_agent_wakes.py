"""What wakes real agents (real Postgres, real listener, child processes, fake GPUs): only
what concerns them. Their fallback poll is a minute here, so that whatever happens within
seconds was woken by a notification, and a claim counted was woken by one too."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from uuid import UUID

import asyncpg
import pytest

from controlplane.agent_port.postgres import PostgresPort
from controlplane.clock import SYSTEM_CLOCK
from controlplane.jobs.lifecycle import Cancel, Job, JobStatus, RequestCheckpoint, SaveCheckpoint
from controlplane.scheduling.claim import Claim
from tests.cluster import USER, Plane, RunningAgent, agent_config
from tests.node_agent.test_agent import SLEEPER, wait_for_line
from tests.polling import eventually

POLL_S = 60.0
PROMPTLY_S = 10.0
"""Well within the poll: what happens this soon was woken by a notification."""
SETTLE_S = 1.0
"""Long enough for a notification to reach the agents and for them to act on it."""


Start = Callable[[str], Awaitable[RunningAgent]]


@pytest.fixture
async def start(plane: Plane, tmp_path: Path) -> AsyncIterator[Start]:
    """Starts an agent of one GPU on node NAME, polling once a minute; stops it afterwards."""
    started: list[RunningAgent] = []

    async def agent(name: str) -> RunningAgent:
        config = replace(agent_config(tmp_path, name), poll_s=POLL_S)
        started.append(await RunningAgent(plane.url, config, fake_gpus=1).started())
        return started[-1]

    yield agent
    for running in started:
        await running.finish()


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How many claims each node's agent has run (the real claim, counted)."""
    counted: Counter[str] = Counter()

    original = PostgresPort.claim

    async def counting(port: PostgresPort, node: str, *, uids: range | None) -> list[Claim]:
        counted[node] += 1
        return await original(port, node, uids=uids)

    monkeypatch.setattr(PostgresPort, "claim", counting)
    yield counted


async def settled(claims: Counter[str], node: str) -> int:
    """The node's claims once its agent has done its first rounds (its listener connecting
    wakes it once more) and is waiting."""

    async def claimed() -> bool:
        return claims[node] > 0

    await eventually(claimed)
    await asyncio.sleep(SETTLE_S)
    return claims[node]


async def projected(owner: asyncpg.Connection, job_id: UUID, version: int) -> None:
    """Once the `jobs` projection has applied the job's stream through `version` (and sent
    its hints)."""

    async def applied() -> bool:
        at = await owner.fetchval("SELECT version FROM job_status WHERE job_id = $1", job_id)
        return at is not None and at >= version

    await eventually(applied)


def on(node: str, *states: JobStatus) -> Callable[[Job], bool]:
    """A job in one of `states`, on `node` alone."""

    def check(job: Job) -> bool:
        return job.state in states and job.nodes == [node]

    return check


async def test_progress_reports_wake_no_other_agent_and_a_submitted_job_is_claimed_at_once(
    plane: Plane, start: Start, owner: asyncpg.Connection, claims: Counter[str]
) -> None:
    await start("n1")
    busy = await plane.submit(SLEEPER)
    await plane.until(busy, on("n1", JobStatus.PROCESSING), PROMPTLY_S)
    await start("n2")
    idle = await settled(claims, "n2")
    full = claims["n1"]

    # A busy log of one job's progress: each report a commit of its own.
    for step in range(1, 21):
        saved = SaveCheckpoint(step, f"/checkpoints/{step}", 1, 0.1, SYSTEM_CLOCK.now())
        job = await plane.jobs.execute(busy, saved, USER)
    _, version = await plane.jobs.current(busy)
    await projected(owner, busy, version)
    await asyncio.sleep(SETTLE_S)
    assert job.last_checkpoint is not None and job.last_checkpoint.step == 20
    assert claims["n2"] == idle  # not one claim more for twenty reports

    # A job submitted now is claimed by the idle node at once, in one claim; the full node
    # does not even look.
    job_id = await plane.submit(SLEEPER)
    await plane.until(job_id, on("n2", JobStatus.DEPLOYING, JobStatus.PROCESSING), PROMPTLY_S)
    await asyncio.sleep(SETTLE_S)
    assert (claims["n1"], claims["n2"]) == (full, idle + 1)


async def test_a_full_node_claims_when_its_learner_ends_not_when_a_job_is_submitted(
    plane: Plane, start: Start, owner: asyncpg.Connection, claims: Counter[str]
) -> None:
    await start("n1")
    first = await plane.submit(SLEEPER)
    await plane.until(first, on("n1", JobStatus.PROCESSING), PROMPTLY_S)
    await wait_for_line(plane, first, "ready")
    full = await settled(claims, "n1")

    waiting = await plane.submit(SLEEPER)
    await projected(owner, waiting, 1)  # queued, and the agents woken
    await asyncio.sleep(SETTLE_S)
    assert claims["n1"] == full
    queued = await plane.jobs.load(waiting)
    assert queued is not None and queued.state is JobStatus.QUEUED

    # The cancel reaches the learner (a request), which ends: its node claims the next job.
    await plane.jobs.execute(first, Cancel("make room", SYSTEM_CLOCK.now()), USER)
    await plane.until(waiting, on("n1", JobStatus.PROCESSING), PROMPTLY_S)
    assert claims["n1"] > full


async def test_checkpoint_requests_and_cancels_reach_the_learner_at_once(
    plane: Plane, start: Start
) -> None:
    await start("n1")
    job_id = await plane.submit(SLEEPER)
    await plane.until(job_id, on("n1", JobStatus.PROCESSING), PROMPTLY_S)
    await wait_for_line(plane, job_id, "ready")
    async with asyncio.timeout(PROMPTLY_S):
        await plane.jobs.execute(job_id, RequestCheckpoint(at=SYSTEM_CLOCK.now()), USER)
        await wait_for_line(plane, job_id, "checkpoint requested")
        await plane.jobs.execute(job_id, Cancel(reason="enough", at=SYSTEM_CLOCK.now()), USER)
        await wait_for_line(plane, job_id, "terminating")
        await plane.state(job_id, JobStatus.CANCELLED)


async def test_a_job_placed_across_two_nodes_starts_on_both_at_once(
    plane: Plane, start: Start
) -> None:
    await start("n1")
    await start("n2")
    show = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(1)"]
    job_id = await plane.submit(show, learners=2)
    # One node's claim placed a learner on the other, which heard of it and started it.
    job = await plane.until(job_id, lambda job: job.state is JobStatus.COMPLETED, PROMPTLY_S)
    assert sorted(job.nodes) == ["n1", "n2"]
