"""Agent crash reconciliation: learners outlive a killed agent, and the restarted agent takes
them back (or kills them when their job moved on), with every log line stored exactly once."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import pytest

from controlplane.agent_port.vocabulary import Allocation
from controlplane.agents.lost_nodes import LostNodes
from controlplane.clock import SYSTEM_CLOCK
from controlplane.jobs.lifecycle import Job, JobStatus, Submit, decide, replay
from controlplane.jobs.manifest import JobManifest
from harness.agent_process import AgentProcess
from node_agent.identity import WorkDirInUse, agent_identity
from node_agent.process_runtime import find_learners
from node_agent.reconcile import VersionedJob, plan
from node_agent.runtime import FoundLearner
from tests.cluster import Plane, learner_space
from tests.node_agent.twin import Twin, TwinAgent
from tests.polling import eventually

LINES = 300


def chatty(seconds: float, exit_code: int = 0) -> list[str]:
    """Prints its pid, then LINES numbered lines (and some on stderr) over `seconds`."""
    return [
        sys.executable,
        "-c",
        "import os, sys, time\n"
        "print('pid', os.getpid(), flush=True)\n"
        f"for i in range({LINES}):\n"
        "    print('line', i, flush=True)\n"
        "    if i % 50 == 0: print('err', i, file=sys.stderr, flush=True)\n"
        f"    time.sleep({seconds / LINES})\n"
        f"sys.exit({exit_code})\n",
    ]


async def stdout_lines(pool: asyncpg.Pool, job_id: UUID) -> list[tuple[int, int, str]]:
    rows = await pool.fetch(
        "SELECT attempt, seq, line FROM job_logs WHERE job_id = $1 AND stream = 'stdout' "
        "ORDER BY attempt, seq",
        job_id,
    )
    return [(r["attempt"], r["seq"], r["line"]) for r in rows]


async def assert_complete_and_once(pool: asyncpg.Pool, job_id: UUID) -> None:
    """Every numbered line exactly once, in order, and seqs with neither gap nor repeat."""
    lines: list[tuple[int, int, str]] = []

    async def shipped() -> bool:
        # The last lines are shipped (batched) just after the job's end is recorded.
        nonlocal lines
        lines = await stdout_lines(pool, job_id)
        return any(text == f"line {LINES - 1}" for _, _, text in lines)

    await eventually(shipped)
    assert [seq for _, seq, _ in lines] == list(range(1, len(lines) + 1))
    numbered = [text for _, _, text in lines if text.startswith("line ")]
    assert numbered == [f"line {i}" for i in range(LINES)]
    assert sum(text.startswith("pid ") for _, _, text in lines) == 1  # one learner, never rerun


async def test_a_killed_agent_s_learner_keeps_running_and_is_re_adopted(
    plane: Plane, tmp_path: Path
) -> None:
    agent = await AgentProcess(plane.url, learner_space() / "n1").start(plane.pool)
    try:
        job_id = await plane.submit(chatty(seconds=4))
        await plane.state(job_id, JobStatus.PROCESSING)
        [found] = await until_found(agent)
        await agent.kill()
        await asyncio.sleep(1)
        os.kill(int(found.handle), 0)  # the learner still runs without its agent
        await agent.start(plane.pool)
        job = await plane.state(job_id, JobStatus.COMPLETED)
        assert job.attempt == 1 and job.restarts == 0
        await assert_complete_and_once(plane.pool, job_id)
        stderr = await plane.pool.fetchval(
            "SELECT count(*) FROM job_logs WHERE job_id = $1 AND stream = 'stderr'", job_id
        )
        assert stderr == LINES // 50
    finally:
        await agent.stop()


@pytest.mark.parametrize(
    ("exit_code", "outcome"), [(0, JobStatus.COMPLETED), (3, JobStatus.FAILED)]
)
async def test_a_learner_that_ended_while_its_agent_was_down_is_reported(
    plane: Plane, tmp_path: Path, exit_code: int, outcome: JobStatus
) -> None:
    agent = await AgentProcess(plane.url, learner_space() / "n1").start(plane.pool)
    try:
        job_id = await plane.submit(chatty(seconds=1.5, exit_code=exit_code))
        await plane.state(job_id, JobStatus.PROCESSING)
        await agent.kill()
        await until_no_learners(agent)
        await agent.start(plane.pool)
        job = await plane.state(job_id, outcome)
        assert job.attempt == 1
        await assert_complete_and_once(plane.pool, job_id)
        if exit_code:
            # Its launcher's status file tells how it ended: the user's error, not retried.
            assert job.failure_reason is not None and "exited with code 3" in job.failure_reason
    finally:
        await agent.stop()


async def test_a_returning_agent_kills_learners_whose_job_moved_on(
    plane: Plane, tmp_path: Path
) -> None:
    agent = await AgentProcess(plane.url, learner_space() / "n1", ttl_s=1).start(plane.pool)
    try:
        job_id = await plane.submit(chatty(seconds=60))
        await plane.state(job_id, JobStatus.PROCESSING)
        [stale] = await until_found(agent)
        await agent.kill()
        # Down for longer than its lease: the node is declared lost, the job restarted.
        await asyncio.sleep(1.5)
        assert await LostNodes(plane.pool, plane.store).declare_expired() == ["n1"]
        job = await plane.state(job_id, JobStatus.QUEUED)
        assert job.attempt == 2
        os.kill(int(stale.handle), 0)  # still running: nobody told it
        await agent.start(plane.pool)
        await until_no_learners(agent, attempt=1)  # killed on return: its epoch is stale
        # The job runs again (on n1, the only node), as attempt 2, from the queue.
        job = await plane.until(job_id, lambda j: j.attempt == 2 and j.state.running)
        history = [e.event.type_name for e in await plane.store.read_stream(f"job-{job_id}")]
        assert history.count("JobRestarted") == 1  # the stale attempt reported nothing
    finally:
        await agent.stop()


async def test_a_second_agent_on_the_same_work_directory_is_refused(
    twin: Twin, twin_agent: TwinAgent
) -> None:
    same_dir = replace(twin_agent.config, name="other")
    with pytest.raises(WorkDirInUse, match="another agent is running on work directory"):
        await TwinAgent(twin, same_dir, fake_gpus=1).started()


def test_the_agent_identity_survives_a_restart(tmp_path: Path) -> None:
    with agent_identity(tmp_path) as first:
        pass
    with agent_identity(tmp_path) as again:
        assert again == first


async def until_found(agent: AgentProcess, attempt: int | None = None) -> list[FoundLearner]:
    found: list[FoundLearner] = []

    async def running() -> bool:
        nonlocal found
        found = [f for f in learners_of(agent) if attempt in (None, f.attempt)]
        return bool(found)

    await eventually(running)
    return found


async def until_no_learners(agent: AgentProcess, attempt: int | None = None) -> None:
    async def none() -> bool:
        return not [f for f in learners_of(agent) if attempt in (None, f.attempt)]

    await eventually(none)


def learners_of(agent: AgentProcess) -> list[FoundLearner]:
    return find_learners(agent.name, agent.work_dir)


# The plan, as a pure function.


def running_job(attempt: int = 1, epoch: int = 7) -> Job:
    manifest = JobManifest.model_validate({"name": "j", "image": "i", "command": ["x"]})
    job = replay(
        decide(Submit(job_id=uuid4(), tenant="t", manifest=manifest, at=SYSTEM_CLOCK.now()), None)
    )
    assert job is not None
    return job.model_copy(
        update={"state": JobStatus.PROCESSING, "attempt": attempt, "epoch": epoch}
    )


def test_the_plan_resumes_current_attempts_releases_old_ones_and_kills_the_stale() -> None:
    current, moved_on, cancelled = running_job(), running_job(attempt=2, epoch=9), running_job()
    cancelled = cancelled.model_copy(update={"state": JobStatus.CANCELLED})
    allocations = [
        Allocation(current.job_id, 1, 0, "n1", 7, ["g0"]),
        Allocation(current.job_id, 1, 1, "n1", 7, ["g1"]),
        # Attempt 1 of a job now at attempt 2:
        Allocation(moved_on.job_id, 1, 0, "n1", 3, ["g2"]),
        Allocation(cancelled.job_id, 1, 0, "n1", 7, ["g3"]),
    ]
    live = FoundLearner(current.job_id, 1, 1, 7, "101")
    stale = FoundLearner(moved_on.job_id, 1, 0, 3, "102")
    orphan = FoundLearner(uuid4(), 4, 0, 2, "103")  # no allocation at all
    jobs = {j.job_id: VersionedJob(j, 5) for j in (current, moved_on, cancelled)}
    result = plan(allocations, jobs, [live, stale, orphan])
    [resumed] = result.resume
    assert resumed.claim.job.job_id == current.job_id and resumed.claim.epoch == 7
    assert [a.gpus for a in resumed.claim.learners] == [["g0"], ["g1"]]
    assert resumed.running == {1: live}  # learner 0 is looked for, or started
    assert sorted(result.release) == sorted([(moved_on.job_id, 1), (cancelled.job_id, 1)])
    assert result.kill == [stale, orphan]


def test_a_learner_of_the_right_attempt_but_another_epoch_is_stale() -> None:
    job = running_job(epoch=8)
    allocations = [Allocation(job.job_id, 1, 0, "n1", 8, ["g0"])]
    old = FoundLearner(job.job_id, 1, 0, 5, "201")
    result = plan(allocations, {job.job_id: VersionedJob(job, 3)}, [old])
    assert result.resume[0].running == {} and result.kill == [old]


def test_learners_another_node_s_claim_placed_here_keep_their_places_in_the_whole_job() -> None:
    # Learner 1 of 3 is this node's; 0 and 2 run on n1: its rank, the world's size and its
    # node's rank are the whole job's, as on the node that claimed it.
    job = running_job().model_copy(update={"learner_nodes": ["n1", "n2", "n1"]})
    [resumed] = plan(
        [Allocation(job.job_id, 1, 1, "n2", 7, ["g5"])], {job.job_id: VersionedJob(job, 4)}, []
    ).resume
    assert [(a.index, a.node, a.gpus) for a in resumed.claim.learners] == [
        (0, "n1", []),
        (1, "n2", ["g5"]),
        (2, "n1", []),
    ]
    assert resumed.claim.nodes == ["n1", "n2"] and resumed.claim.on("n2")[0].index == 1
