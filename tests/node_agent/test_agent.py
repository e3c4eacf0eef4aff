"""The node agent: real child processes, fake GPUs, on the port's in-memory twin; end to end on
real Postgres for a job's whole run, a cancelled agent's shutdown and a lost database."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import replace
from pathlib import Path
from uuid import UUID

import asyncpg
import pytest

from controlplane.agents.nodes import NodeNameTaken
from controlplane.clock import SYSTEM_CLOCK
from controlplane.database import DATABASE_ERRORS
from controlplane.jobs.events import CheckpointSaved
from controlplane.jobs.lifecycle import Cancel, JobStatus, RequestCheckpoint, Restart
from controlplane.jobs.limits import JobLimits
from controlplane.jobs.manifest import JobManifest
from node_agent.attempt import PREEMPTED
from node_agent.service import LeaseLost
from runners import protocol
from tests.cluster import A_WHOLE_RUN, USER, Plane, RunningAgent, agent_config
from tests.node_agent.twin import Twin, TwinAgent
from tests.polling import eventually

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
    assert [t.state for t in job.transitions] == A_WHOLE_RUN
    assert len(job.gpus) == 1 and job.nodes == ["n1"]
    await wait_for_line(plane, job_id, f"gpus={job.gpus[0]}")  # exactly its GPU is visible

    # The GPU goes back once the agent has stored the attempt's last lines and removed its
    # learner, which it does after reporting the job's end: a moment after COMPLETED.
    async def released() -> bool:
        return bool(await owner.fetchval("SELECT count(*) FROM allocated_gpus") == 0)

    await eventually(released, seconds=10)


async def test_on_the_twin_a_job_runs_to_completion_and_its_gpu_goes_back(
    twin: Twin, twin_agent: TwinAgent
) -> None:
    job_id = await twin.submit(PRINT_GPUS)
    job = await twin.state(job_id, JobStatus.COMPLETED)
    assert job.exit_codes == [0]
    assert [t.state for t in job.transitions] == A_WHOLE_RUN
    assert len(job.gpus) == 1 and job.nodes == ["n1"]
    await wait_for_line(twin, job_id, f"gpus={job.gpus[0]}")

    async def released() -> bool:
        return await twin.port.allocations("n1") == []

    await eventually(released, seconds=10)


async def test_two_jobs_never_share_the_node_s_gpus(twin: Twin, twin_agent: TwinAgent) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(1)"]
    jobs = [await twin.submit(sleeper) for _ in range(3)]
    finished = [await twin.state(j, JobStatus.COMPLETED) for j in jobs]
    assert all(len(job.gpus) == 1 for job in finished)
    # Two GPUs, three jobs: the third waited for a free GPU; the two that overlapped differed.
    starts = sorted(finished, key=lambda job: job.transitions[1].at)
    assert starts[0].gpus != starts[1].gpus


async def test_a_failing_command_fails_the_job_with_its_exit_code(
    twin: Twin, twin_agent: TwinAgent
) -> None:
    job_id = await twin.submit(
        [sys.executable, "-c", "print('about to fail'); raise SystemExit(3)"]
    )
    job = await twin.state(job_id, JobStatus.FAILED)
    assert job.exit_codes == [3]
    assert job.failure_reason is not None and "exited with code 3" in job.failure_reason
    await wait_for_line(twin, job_id, "about to fail")


async def test_a_command_that_cannot_start_fails_with_the_error(
    twin: Twin, twin_agent: TwinAgent
) -> None:
    job_id = await twin.submit(["no-such-program-anywhere", "--flag"])
    job = await twin.state(job_id, JobStatus.FAILED)
    assert job.failure_reason is not None and "no-such-program-anywhere" in job.failure_reason
    await wait_for_line(twin, job_id, "no-such-program-anywhere")


SIGNALLED = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *_: os.write(1, b'checkpoint requested\\n'))\n"
    "signal.signal(signal.SIGTERM, lambda *_: (os.write(1, b'terminating\\n'), sys.exit(0)))\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)
"""A learner's code that says what signals it gets (SIGUSR1: a checkpoint request; SIGTERM).
Each line in one write: a `print` writes its text and its newline apart, and a SIGTERM handled
between the two put "terminating" on the checkpoint's line."""
SLEEPER = [sys.executable, "-c", SIGNALLED]


async def wait_for_line(plane: Plane | Twin, job_id: UUID, text: str) -> None:
    async def logged() -> bool:
        with contextlib.suppress(*DATABASE_ERRORS):
            return any(text in line for line in await plane.log_text(job_id))
        return False

    await eventually(logged)


async def test_checkpoint_requests_and_cancel_reach_the_learner(
    twin: Twin, twin_agent: TwinAgent
) -> None:
    job_id = await twin.submit(SLEEPER)
    await twin.state(job_id, JobStatus.PROCESSING)
    await wait_for_line(twin, job_id, "ready")
    await twin.jobs.execute(job_id, RequestCheckpoint(at=SYSTEM_CLOCK.now()), USER)
    await wait_for_line(twin, job_id, "checkpoint requested")
    await twin.jobs.execute(job_id, Cancel(reason="enough", at=SYSTEM_CLOCK.now()), USER)
    await wait_for_line(twin, job_id, "terminating")  # SIGTERM, within the grace period

    async def released() -> bool:
        return await twin.port.allocations("n1") == []

    await eventually(released)
    assert (await twin.state(job_id, JobStatus.CANCELLED)).failure_reason is None


async def test_a_name_held_by_a_live_agent_is_refused(
    twin: Twin, twin_agent: TwinAgent, tmp_path: Path
) -> None:
    elsewhere = agent_config(tmp_path / "another-machine")
    with pytest.raises(NodeNameTaken, match="held by a live agent"):
        await TwinAgent(twin, elsewhere, fake_gpus=1).started()


async def test_stopping_the_agent_sends_running_jobs_back_to_the_queue(
    twin: Twin, tmp_path: Path
) -> None:
    running = await TwinAgent(twin, agent_config(tmp_path, grace_s=5), fake_gpus=1).started()
    job_id = await twin.submit(SLEEPER)
    await twin.state(job_id, JobStatus.PROCESSING)
    await wait_for_line(twin, job_id, "ready")
    await running.finish()
    job = await twin.state(job_id, JobStatus.QUEUED)
    # Preempted, not failed: its learner was asked to checkpoint, and no restart is spent.
    assert job.attempt == 2 and job.restarts == 0
    assert job.transitions[-1].reason == PREEMPTED
    await wait_for_line(twin, job_id, "terminating")


async def test_a_job_preempted_by_its_agent_s_stop_spends_no_restart(
    twin: Twin, tmp_path: Path
) -> None:
    job_id = await twin.submit(SLEEPER, max_restarts=0)
    for attempt in (1, 2):
        running = await TwinAgent(twin, agent_config(tmp_path, grace_s=5), fake_gpus=1).started()
        await twin.state(job_id, JobStatus.PROCESSING)

        async def ready(count: int = attempt) -> bool:
            """This attempt's learner is ready (each attempt's says so once)."""
            return sum("ready" in line for line in await twin.log_text(job_id)) >= count

        await eventually(ready)
        await running.finish()
    # Twice stopped with no restart allowed at all: queued again each time, never FAILED.
    job = await twin.state(job_id, JobStatus.QUEUED)
    assert (job.attempt, job.restarts) == (3, 0)
    assert [t.reason for t in job.transitions if t.state is JobStatus.QUEUED][1:] == [PREEMPTED] * 2


async def test_a_cancelled_agent_stops_as_a_stopped_one_does_before_the_cancellation_goes_on(
    plane: Plane, tmp_path: Path, owner: asyncpg.Connection
) -> None:
    running = await RunningAgent(
        plane.url, agent_config(tmp_path, grace_s=5), fake_gpus=1
    ).started()
    job_id = await plane.submit(SLEEPER)
    await plane.state(job_id, JobStatus.PROCESSING)
    await wait_for_line(plane, job_id, "ready")
    running.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(running.task, 30)
    # All of it done before the cancellation came out: the learner was stopped, its job went
    # back to the queue, its GPU came back and the node's name was given back.
    job = await plane.state(job_id, JobStatus.QUEUED)
    assert job.attempt == 2 and job.restarts == 0
    assert job.transitions[-1].reason == PREEMPTED
    await wait_for_line(plane, job_id, "terminating")
    assert await owner.fetchval("SELECT count(*) FROM allocated_gpus") == 0
    assert await owner.fetchval("SELECT state FROM nodes WHERE name = 'n1'") == "GONE"


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


async def test_data_that_cannot_be_fetched_fails_the_job_in_downloading(
    twin: Twin, twin_agent: TwinAgent, tmp_path: Path
) -> None:
    missing = f"file://{tmp_path}/no-such-data.bin"
    job_id = await twin.submit(
        [sys.executable, "-c", "print('never runs')"], data={"source": missing}
    )
    job = await twin.state(job_id, JobStatus.FAILED)
    assert [t.state for t in job.transitions][-2:] == [JobStatus.DOWNLOADING, JobStatus.FAILED]
    assert job.failure_reason is not None and missing in job.failure_reason
    assert "never runs" not in await twin.log_text(job_id)


async def test_checkpoint_reports_past_the_jobs_rate_are_not_recorded_and_say_so(
    twin: Twin, twin_agent: TwinAgent
) -> None:
    report = protocol.CheckpointSaved(
        at=SYSTEM_CLOCK.now(), step=0, path="/forged", size_bytes=1, sha256="0" * 64, duration_s=0.0
    )
    # A learner printing forged reports as fast as it can (each a step further).
    script = (
        "import json, os, time\n"
        f"report = json.loads({protocol.encode(report).removeprefix(protocol.PREFIX)!r})\n"
        "folder = os.environ['TRAINYARD_CHECKPOINT_DIR']\n"
        "for step in range(1, 201):\n"
        "    forged = {**report, 'step': step, 'path': f'{folder}/step-{step}'}\n"
        f"    print({protocol.PREFIX!r} + json.dumps(forged), flush=True)\n"
        "time.sleep(0.5)\n"
    )
    manifest = JobManifest(name="t", image="i", command=[sys.executable, "-c", script])
    # Burst 10 reports, then one a second: at most a few more while it runs.
    job, _ = await twin.jobs.submit("acme", manifest, USER, None, JobLimits(reports_per_s=1))
    await twin.state(job.job_id, JobStatus.COMPLETED)
    saved = [r for r in await twin.jobs.history(job.job_id) if isinstance(r.event, CheckpointSaved)]
    assert 10 <= len(saved) <= 14
    await wait_for_line(twin, job.job_id, "not recorded: this job's learners may report 1 per")


def _report_then_exit_1(path: str) -> list[str]:
    """A learner that reports a checkpoint at `path` (formatted with `folder`, its checkpoint
    folder), then fails with exit code 1."""
    report = protocol.CheckpointSaved(
        at=SYSTEM_CLOCK.now(), step=5, path="{path}", size_bytes=1, sha256="0" * 64, duration_s=0
    )
    script = (
        "import os\n"
        "folder = os.environ['TRAINYARD_CHECKPOINT_DIR']\n"
        f"line = {protocol.encode(report)!r}.replace('{{path}}', {path!r}.format(folder=folder))\n"
        "print(line, flush=True)\n"
        "raise SystemExit(1)\n"
    )
    return [sys.executable, "-c", script]


def _checkpoint_then_exit_1() -> list[str]:
    """A learner that reports a checkpoint in its folder, then fails with exit code 1."""
    return _report_then_exit_1("{folder}/5")


async def test_a_checkpoint_reported_outside_the_learners_folder_is_not_recorded(
    twin: Twin, twin_agent: TwinAgent
) -> None:
    # The path is the learner's word; the control plane reads it back to resume from it and to
    # publish it as a model: one outside the learner's folder would name another's file.
    for forged in ("/etc/shadow", "{folder}/../../../other-job/checkpoints/learner-0/5"):
        job_id = await twin.submit(_report_then_exit_1(forged), max_restarts=0)
        job = await twin.state(job_id, JobStatus.FAILED)
        assert job.last_checkpoint is None
        await wait_for_line(twin, job_id, "not in the learner's checkpoint folder")


async def test_restart_on_infrastructure_fails_a_non_zero_exit_and_says_how_to_change_that(
    twin: Twin, twin_agent: TwinAgent
) -> None:
    job_id = await twin.submit(_checkpoint_then_exit_1(), restart_on="infrastructure")
    job = await twin.state(job_id, JobStatus.FAILED)
    assert job.last_checkpoint is not None and job.attempt == 1
    assert job.failure_reason is not None
    assert "exited with code 1 (restart_on is infrastructure: not retried" in job.failure_reason
    assert "set restart_on: any_failure" in job.failure_reason

    # The default retries it (from its checkpoint), here up to a limit of none.
    job_id = await twin.submit(_checkpoint_then_exit_1(), max_restarts=0)
    job = await twin.state(job_id, JobStatus.FAILED)
    assert job.failure_reason is not None
    assert job.failure_reason.startswith("restart limit (0) reached")
    assert job.failure_reason.endswith("(max_restarts sets the limit)")


async def test_an_agent_whose_node_is_declared_lost_kills_its_learners_and_stops(
    twin: Twin, tmp_path: Path
) -> None:
    running = await TwinAgent(twin, agent_config(tmp_path), fake_gpus=1).started()
    job_id = await twin.submit(SLEEPER)
    await twin.state(job_id, JobStatus.PROCESSING)
    await wait_for_line(twin, job_id, "ready")
    twin.port.lose("n1")
    with pytest.raises(LeaseLost, match="lost its lease"):
        await asyncio.wait_for(running.task, 30)
    # Fenced: its learner stopped without a report (no exit, no requeue): the job is left for
    # the control plane, which restarts a lost node's jobs elsewhere.
    job = await twin.state(job_id, JobStatus.PROCESSING)
    assert job.attempt == 1 and job.nodes == ["n1"] and job.exit_codes == []


async def test_a_job_s_next_attempt_claimed_here_stops_its_last_one_still_running(
    twin: Twin, tmp_path: Path
) -> None:
    # B's learner ends on its own, after A's restart; its end wakes a round that claims
    # without reading the jobs' news, and the poll (which reads them first) is a minute away.
    a = await twin.submit(SLEEPER)
    b = await twin.submit([sys.executable, "-c", "import time; time.sleep(5)"])
    config = replace(agent_config(tmp_path), poll_s=60)
    agent = await TwinAgent(twin, config, fake_gpus=3).started()
    try:
        await wait_for_line(twin, a, "ready")
        await twin.state(b, JobStatus.PROCESSING)
        await twin.jobs.execute(a, Restart(reason="its node was lost", at=SYSTEM_CLOCK.now()), USER)
        b_now = twin.port.job(b)
        assert b_now is not None and b_now.state is JobStatus.PROCESSING  # it ends after
        await twin.state(b, JobStatus.COMPLETED)
        await twin.until(a, lambda job: job.attempt == 2 and job.state is JobStatus.PROCESSING)
        # The last attempt is told to stop as the next one starts, not left running beside it.
        await wait_for_line(twin, a, "terminating")
    finally:
        await agent.finish()
