"""Chaos: kill -9 an agent, the control plane, a learner and a whole node while a job runs, with
real processes (`trainyard serve`, `trainyard agent`, learners running the checkpointing
`runners.examples.counter`) on a real Postgres. Every job still completes, with the attempts the
crash called for, a history that says what happened and when, each attempt's log lines exactly
once (as the learner wrote them), a restarted attempt resumed from the checkpoint on record, and
never two live learners of the job at any instant."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

import asyncpg
import pytest

from controlplane.agents.events import NodeLost
from controlplane.agents.nodes import node_stream
from controlplane.jobs.events import CheckpointSaved, JobRestarted
from controlplane.jobs.lifecycle import Job, JobStatus
from controlplane.logs.lines import LogLine
from harness import processes
from harness.processes import Cluster, counter, kill_learner, until
from node_agent.learners import learner_dir
from node_agent.process_runtime import OUTPUT_FILES, find_learners
from runners import protocol
from tests.cluster import learner_space
from tests.polling import eventually
from trainyard.api import ApiClient, SseMessage

STEPS = 160
STEP_S = 0.025
"""Four seconds of counting, a checkpoint a second: a crash comes mid-job, after a checkpoint."""
TTL_S = 3.0
HEARTBEAT_S = 0.5
SAMPLE_S = 0.05
TERMINAL = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


@pytest.fixture
async def cluster(db_url: str, pool: asyncpg.Pool, tmp_path: Path) -> AsyncIterator[Cluster]:
    """A served control plane; the test adds agents."""
    async with processes.cluster(db_url, learner_space(), pool) as running:
        await running.add_plane()
        yield running


@asynccontextmanager
async def one_learner_at_a_time(cluster: Cluster, job_id: UUID) -> AsyncIterator[None]:
    """Sample the job's live learners on every node of the cluster while the block runs; fail
    if two of them ever ran at once (of one attempt, or of two)."""
    seen: list[list[tuple[str, int]]] = []

    async def sample() -> None:
        while True:
            found = cluster.learners(job_id)
            if len(found) > 1:
                seen.append([(f.handle, f.attempt) for f in found])
            await asyncio.sleep(SAMPLE_S)

    sampler = asyncio.create_task(sample())
    try:
        yield
    finally:
        sampler.cancel()
        await asyncio.wait({sampler})
    assert not seen, f"two learners of job {job_id} ran at once: {seen[:3]}"


async def finished(cluster: Cluster, job_id: UUID) -> Job:
    return await cluster.until_job(job_id, lambda job: job.state in TERMINAL)


async def assert_log(
    cluster: Cluster,
    job_id: UUID,
    attempt: int,
    work_dir: Path,
    *,
    restored: int,
    last: int | None = None,
    shipped: bool = True,
    learner: int = 0,
) -> None:
    """The attempt's stored lines of `learner` are its output files line for line, each
    stream's seqs running 1..n; or only the start of them when its node was lost with the lines
    it had not `shipped`. The counter's lines run on without a gap from the `restored` step (to
    `last`, when given: none at all when it restored `last`)."""
    files = {
        stream: (learner_dir(work_dir, job_id, attempt, learner) / name).read_text().splitlines()
        for stream, name in OUTPUT_FILES.items()
    }
    lines: list[LogLine] = []

    async def learner_s() -> list[LogLine]:
        return [line for line in await cluster.lines(job_id, attempt) if line.learner == learner]

    async def stored_all() -> bool:
        # The last lines are shipped (batched) just after the attempt's end is recorded.
        nonlocal lines
        lines = await learner_s()
        return len(lines) == sum(map(len, files.values()))

    if shipped:
        await eventually(stored_all, seconds=10)
    else:
        lines = await learner_s()
    for stream, written in files.items():
        stored = [line for line in lines if line.stream == stream]
        assert [line.seq for line in stored] == list(range(1, len(stored) + 1))
        texts = [line.text for line in stored]
        assert texts == (written if shipped else written[: len(texts)])
    steps = [int(text[5:]) for line in lines if (text := line.text).startswith("step ")]
    if last is None:
        assert steps and steps == list(range(restored + 1, restored + 1 + len(steps)))
    else:
        assert steps == list(range(restored + 1, last + 1))


async def restored_step(cluster: Cluster, job_id: UUID, restarted: JobRestarted) -> int:
    """The step that the restarted attempt restored, which must be the checkpoint on record
    when the job was restarted (its last CheckpointSaved)."""
    saved = [
        e.event
        for e in await cluster.jobs.history(job_id)
        if isinstance(e.event, CheckpointSaved) and e.event.attempt == restarted.attempt - 1
    ]
    assert saved and restarted.resume_from == saved[-1].path
    reports = [
        report
        for line in await cluster.lines(job_id, restarted.attempt)
        if isinstance(report := protocol.parse(line.text), protocol.CheckpointRestored)
    ]
    assert [(r.step, r.path) for r in reports] == [(saved[-1].step, saved[-1].path)]
    return saved[-1].step


def assert_history(job: Job, *, restarted: bool) -> None:
    """Completed in one attempt, or in two with one restart; every state entered once an
    attempt, in order, with times that never go back."""
    attempts = [1, 2] if restarted else [1]
    assert job.state is JobStatus.COMPLETED
    assert (job.attempt, job.restarts) == (attempts[-1], len(attempts) - 1)
    run = [JobStatus.QUEUED, JobStatus.DEPLOYING, JobStatus.DOWNLOADING, JobStatus.PROCESSING]
    expected = [(state, n) for n in attempts for state in run]
    expected += [(JobStatus.STORING, attempts[-1]), (JobStatus.COMPLETED, attempts[-1])]
    assert [(t.state, t.attempt) for t in job.transitions] == expected
    times = [t.at for t in job.transitions]
    assert times == sorted(times)


def restart_of(job: Job, attempt: int) -> tuple[str | None, datetime]:
    """The reason and time of the restart that began `attempt`, as the history tells them."""
    [restart] = [t for t in job.transitions if t.state is JobStatus.QUEUED and t.attempt == attempt]
    return restart.reason, restart.at


async def test_an_agent_killed_mid_job_leaves_its_learner_running_and_takes_it_back(
    cluster: Cluster,
) -> None:
    agent = await cluster.add_agent(ttl_s=TTL_S, heartbeat_s=HEARTBEAT_S)
    job_id = await cluster.submit(counter(STEPS, STEP_S), cluster.planes[0])
    async with one_learner_at_a_time(cluster, job_id):
        await cluster.job_event(job_id, CheckpointSaved)
        learner = await cluster.learner(job_id, attempt=1)
        await agent.kill()
        await asyncio.sleep(0.5)
        assert cluster.learners(job_id) == [learner]  # it runs on without its agent
        await agent.start(cluster.pool)
        assert cluster.learners(job_id) == [learner]  # to be re-adopted, not started again
        job = await finished(cluster, job_id)
    assert_history(job, restarted=False)
    await assert_log(cluster, job_id, 1, agent.work_dir, restored=0, last=STEPS)


async def test_a_control_plane_killed_mid_job_costs_the_job_nothing_and_sse_resumes(
    cluster: Cluster,
) -> None:
    await cluster.add_agent(ttl_s=TTL_S, heartbeat_s=HEARTBEAT_S)
    plane = cluster.planes[0]
    job_id = await cluster.submit(counter(STEPS, STEP_S), plane)
    async with one_learner_at_a_time(cluster, job_id), asyncio.TaskGroup() as group:
        following = group.create_task(follow_until_terminal(cluster, job_id))
        await cluster.job_event(job_id, CheckpointSaved)
        await plane.kill()
        down_at = datetime.now(UTC)
        await asyncio.sleep(1.5)  # the job runs on, its events are appended, nobody serves
        up_at = datetime.now(UTC)
        await plane.start()
        job = await finished(cluster, job_id)
    messages = following.result()
    assert_history(job, restarted=False)
    # The stream resumed after the restart with Last-Event-ID: every event once, in order.
    history = await cluster.jobs.history(job_id)
    assert [(m.id, m.event) for m in messages] == [
        (str(e.position), e.event.type_name) for e in history
    ]
    assert any(down_at < e.recorded_at < up_at for e in history)  # some came while it was down
    work_dir = cluster.agents[job.nodes[0]].work_dir
    await assert_log(cluster, job_id, 1, work_dir, restored=0, last=STEPS)


async def follow_until_terminal(cluster: Cluster, job_id: UUID) -> list[SseMessage]:
    """The job's SSE stream, as a client that reconnects with Last-Event-ID reads it."""
    messages = []
    async with (
        ApiClient(cluster.planes[0].url, cluster.token) as client,
        aclosing(client.follow(f"/v1/jobs/{job_id}/events")) as stream,
    ):
        async for message in stream:
            messages.append(message)
            if message.event in ("JobCompleted", "JobFailed", "JobCancelled"):
                return messages
    raise AssertionError("the stream ended before the job did")


async def test_a_killed_learner_is_restarted_from_its_checkpoint(cluster: Cluster) -> None:
    agent = await cluster.add_agent(ttl_s=TTL_S, heartbeat_s=HEARTBEAT_S)
    job_id = await cluster.submit(counter(STEPS, STEP_S), cluster.planes[0])
    async with one_learner_at_a_time(cluster, job_id):
        await cluster.job_event(job_id, CheckpointSaved)
        killed_at = datetime.now(UTC)
        kill_learner(await cluster.learner(job_id, attempt=1))
        job = await finished(cluster, job_id)
    assert_history(job, restarted=True)
    reason, restarted_at = restart_of(job, 2)
    assert reason == "learner 0 killed by SIGKILL"
    restarted = await cluster.job_event(job_id, JobRestarted)
    assert killed_at < restarted_at == restarted.at < killed_at + timedelta(seconds=10)
    # The backoff was honoured: attempt 2 was not deployed before it ended.
    assert restarted.not_before is not None
    deployed = [t.at for t in job.transitions if t.state is JobStatus.DEPLOYING and t.attempt == 2]
    assert deployed and deployed[0] >= restarted.not_before
    await assert_log(cluster, job_id, 1, agent.work_dir, restored=0)
    step = await restored_step(cluster, job_id, restarted)
    assert step > 0
    await assert_log(cluster, job_id, 2, agent.work_dir, restored=step, last=STEPS)


async def test_a_lost_node_s_job_resumes_from_its_checkpoint_on_another_node(
    cluster: Cluster,
) -> None:
    for _ in range(2):
        await cluster.add_agent(ttl_s=TTL_S, heartbeat_s=HEARTBEAT_S)
    job_id = await cluster.submit(counter(STEPS, STEP_S), cluster.planes[0])
    async with one_learner_at_a_time(cluster, job_id):
        await cluster.job_event(job_id, CheckpointSaved)
        learner = await cluster.learner(job_id, attempt=1)
        [lost] = (await cluster.job(job_id)).nodes
        killed_at = datetime.now(UTC)
        # The machine dies: its agent and its learners at once.
        await cluster.agents[lost].kill()
        kill_learner(learner)
        job = await finished(cluster, job_id)
    assert_history(job, restarted=True)
    [elsewhere] = job.nodes
    assert elsewhere != lost
    reason, restarted_at = restart_of(job, 2)
    assert reason is not None and reason.startswith("node_lost")
    # Not before the lease can have run out (a hiccup shorter than the TTL restarts nothing).
    after_s = (restarted_at - killed_at).total_seconds()
    assert TTL_S - HEARTBEAT_S <= after_s < TTL_S + 10
    declared = await cluster.event(node_stream(lost), NodeLost)
    assert declared.at == restarted_at
    lost_dir, elsewhere_dir = cluster.agents[lost].work_dir, cluster.agents[elsewhere].work_dir
    await assert_log(cluster, job_id, 1, lost_dir, restored=0, shipped=False)
    step = await restored_step(cluster, job_id, await cluster.job_event(job_id, JobRestarted))
    assert step > 0
    await assert_log(cluster, job_id, 2, elsewhere_dir, restored=step, last=STEPS)


async def test_a_lost_node_stops_its_job_s_ranks_on_other_nodes_and_the_job_runs_again_whole(
    cluster: Cluster,
) -> None:
    """Deliverable 3 of distributed training: a rank that loses its node takes its peers down
    with it. A machine that dies whole closes no connection its peers could notice, so the loss
    is known when its lease runs out; the job's ranks on the live nodes are then stopped (fenced
    by the restart) and the job runs again, all ranks, on nodes that are live."""
    for _ in range(3):
        await cluster.add_agent(ttl_s=TTL_S, heartbeat_s=HEARTBEAT_S)
    manifest = {**counter(STEPS, STEP_S), "learners": 2, "learners_per_node": 1}
    job_id = await cluster.submit(manifest, cluster.planes[0])
    await cluster.job_event(job_id, CheckpointSaved)
    first = await cluster.job(job_id)
    assert len(set(first.nodes)) == 2
    lost = first.nodes[0]
    [dying] = [f for f in find_learners(lost, cluster.agents[lost].work_dir) if f.job_id == job_id]
    killed_at = time.monotonic()
    await cluster.agents[lost].kill()
    kill_learner(dying)

    async def peers_stopped() -> bool | None:
        # `learners` looks on every node, the lost one included (its learner was killed).
        return True if not [f for f in cluster.learners(job_id) if f.attempt == 1] else None

    await until(peers_stopped)
    stopped_s = time.monotonic() - killed_at
    # The lease's TTL, the manager's sweep, and the live node's agent hearing of the restart.
    assert stopped_s < TTL_S + 3, stopped_s
    job = await finished(cluster, job_id)
    assert (job.state, job.attempt, job.restarts) == (JobStatus.COMPLETED, 2, 1)
    reason, _ = restart_of(job, 2)
    assert reason is not None and reason.startswith("node_lost")
    assert lost not in job.nodes and len(set(job.nodes)) == 2

    # Both ranks of attempt 2 ran to its end: the counter exits 0 only after its last step.
    assert job.exit_codes == [0, 0]
    # Rank 1's lines of attempt 2 are all stored, its last step among them. It may have no
    # step to print: it ran on while its peer's node was being found lost, and when it had
    # counted to the end (a checkpoint at STEPS on record) before the restart, attempt 2
    # resumes it there; its output files say so, and its log must too.
    rank_1 = cluster.agents[job.learner_nodes[1]].work_dir
    [restored] = [
        report.step
        for line in await cluster.lines(job_id, 2)
        if line.learner == 1
        and isinstance(report := protocol.parse(line.text), protocol.CheckpointRestored)
    ] or [0]
    await assert_log(cluster, job_id, 2, rank_1, restored=restored, last=STEPS, learner=1)
