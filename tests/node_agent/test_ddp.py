"""A job whose learners train together, on one agent with real processes: the digits example in
DistributedDataParallel as a two-learner job (gloo, on the CPU). Its ranks meet through the
agent's contract alone; when rank 1 is SIGKILLed halfway, every rank of the attempt is stopped
within 5 s, and the job restarts both from rank 0's last checkpoint and ends with exactly the
weights of a run never stopped. An agent's stop (a preemption) has both ranks save one
checkpoint at once, spends no restart, and the job resumes from that checkpoint."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from uuid import UUID

import torch

from controlplane.jobs.lifecycle import Job, JobStatus
from node_agent.attempt import PREEMPTED
from node_agent.learners import learner_dir
from runners import protocol
from tests.cluster import agent_config
from tests.node_agent.twin import Twin, TwinAgent

STEPS = 40
EVERY = 10


def ddp_command() -> list[str]:
    return [
        *(sys.executable, "-m", "runners.examples.digits_ddp", "--seed", "3"),
        *("--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--log-every", "5"),
        # Paced, so that the test sees a checkpoint and kills rank 1 before the end.
        *("--step-seconds", "0.1", "--device", "cpu", "--weights", "weights.pt"),
    ]


def processes_of(job_id: UUID, attempt: int | None = None) -> dict[int, tuple[int, str]]:
    """The processes of the job's learners on this machine (of `attempt`, or any): pid ->
    (learner, command line). Every process of a learner has its TRAINYARD_* environment."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = dict(
                item.split("=", 1)
                for item in (entry / "environ").read_bytes().decode(errors="replace").split("\0")
                if "=" in item
            )
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if environ.get("TRAINYARD_JOB_ID") != str(job_id):
            continue
        if attempt is not None and environ.get("TRAINYARD_ATTEMPT") != str(attempt):
            continue
        found[int(entry.name)] = (int(environ["TRAINYARD_LEARNER"]), cmdline)
    return found


def training_command(job_id: UUID, learner: int) -> int:
    """The pid of the learner's training command (not its launcher, nor the sandbox's init)."""
    [pid] = [
        pid
        for pid, (index, cmdline) in processes_of(job_id).items()
        if index == learner and "digits_ddp" in cmdline and "runners.launch" not in cmdline
    ]
    return pid


def ended(job: Job) -> bool:
    return job.state in (JobStatus.COMPLETED, JobStatus.FAILED)


def final_weights(agent: TwinAgent, job: Job) -> dict[str, torch.Tensor]:
    path = learner_dir(agent.config.work_dir, job.job_id, job.attempt, 0) / "weights.pt"
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


async def test_a_two_rank_job_whose_rank_1_is_killed_stops_within_5_s_and_resumes_exactly(
    twin: Twin, tmp_path: Path
) -> None:
    agent = await TwinAgent(twin, agent_config(tmp_path), fake_gpus=0).started()
    try:
        straight = await twin.submit(ddp_command(), learners=2, gpus_per_learner=0)
        done = await twin.until(straight, ended, seconds=120)
        assert done.state is JobStatus.COMPLETED, await twin.log_text(straight)
        # Why an attempt ended, should one have: once in three CI runs the first did (12-02).
        assert done.attempt == 1, [(t.state, t.reason) for t in done.transitions]

        crashed = await twin.submit(ddp_command(), learners=2, gpus_per_learner=0)
        halfway = await twin.until(
            crashed,
            lambda job: job.last_checkpoint is not None and job.last_checkpoint.step >= EVERY,
            seconds=60,
        )
        assert halfway.last_checkpoint is not None
        saved = halfway.last_checkpoint.step
        os.kill(training_command(crashed, 1), signal.SIGKILL)
        killed_at = time.monotonic()
        while processes_of(crashed, attempt=1):
            assert time.monotonic() - killed_at < 5, processes_of(crashed, attempt=1)
            await asyncio.sleep(0.05)

        resumed = await twin.until(crashed, ended, seconds=120)
        lines = await twin.log_text(crashed)
        assert resumed.state is JobStatus.COMPLETED, lines
        # Both ranks again, in attempt 2, from rank 0's last checkpoint.
        # Why a second attempt ended too, should one have (once in CI, 12-03).
        assert (resumed.attempt, resumed.restarts) == (2, 1), [
            (t.state, t.reason) for t in resumed.transitions
        ]
        reasons = [t.reason or "" for t in resumed.transitions if t.state is JobStatus.QUEUED]
        assert "learner 1 killed by SIGKILL" in reasons[-1], resumed.transitions
        restored = [protocol.parse(line) for line in lines]
        steps = [m.step for m in restored if isinstance(m, protocol.CheckpointRestored)]
        assert len(steps) == 1 and saved <= steps[0] < STEPS, lines
        ours, theirs = final_weights(agent, resumed), final_weights(agent, done)
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    finally:
        await agent.finish()


async def test_an_agent_s_stop_checkpoints_both_ranks_at_once_and_spends_no_restart(
    twin: Twin, tmp_path: Path
) -> None:
    config = agent_config(tmp_path, grace_s=20)
    agent = await TwinAgent(twin, config, fake_gpus=0).started()
    job_id = await twin.submit(ddp_command(), learners=2, gpus_per_learner=0)
    try:

        def between_checkpoints(job: Job) -> bool:
            last = job.last_checkpoint
            return last is not None and last.step >= EVERY

        await twin.until(job_id, between_checkpoints, seconds=120)
        await asyncio.sleep(0.35)  # a few steps past it (0.1 s a step)
    finally:
        await agent.finish()  # as on SIGTERM: the learners have its grace to checkpoint
    stopped = await twin.state(job_id, JobStatus.QUEUED)
    assert (stopped.attempt, stopped.restarts) == (2, 0)
    assert stopped.transitions[-1].reason == PREEMPTED
    # Rank 0 saved at the step the SIGTERM reached, not at a multiple of --checkpoint-every.
    assert stopped.last_checkpoint is not None and stopped.last_checkpoint.attempt == 1
    assert stopped.last_checkpoint.step % EVERY != 0, stopped.last_checkpoint
    assert not processes_of(job_id)

    # The node's next agent (its checkpoints are on the node's disk).
    agent = await TwinAgent(twin, config, fake_gpus=0).started()
    try:
        done = await twin.until(job_id, ended, seconds=120)
    finally:
        await agent.finish()
    lines = await twin.log_text(job_id)
    assert done.state is JobStatus.COMPLETED, lines
    restored = [
        m.step for m in map(protocol.parse, lines) if isinstance(m, protocol.CheckpointRestored)
    ]
    assert restored == [stopped.last_checkpoint.step]
