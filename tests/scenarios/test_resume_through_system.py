"""The PyTorch example through the whole system: its learner is killed (SIGKILL) mid-training,
the agent's restart policy re-queues the job, the new attempt resumes from the last checkpoint
(not from zero) and ends with the same loss as an uninterrupted run with the same seed."""

from __future__ import annotations

import os
import signal
import sys
from uuid import UUID

import psutil

from controlplane.jobs.events import CheckpointSaved
from controlplane.jobs.lifecycle import JobStatus
from controlplane.logs.metrics import read_metrics
from runners import protocol
from tests.cluster import Plane, RunningAgent
from tests.polling import eventually

TRAIN = [sys.executable, "-m", "runners.examples.classifier", "--seed", "11", "--steps", "3000"]


async def final_loss(plane: Plane, job_id: UUID) -> float:
    """The final loss the job's last attempt reported (an attempt killed just as it ended may
    have reported one too, before the kill landed)."""
    points = await read_metrics(plane.pool, job_id)
    last = max(p.attempt for p in points)
    finals = [
        p.values["final_loss"] for p in points if p.attempt == last and "final_loss" in p.values
    ]
    assert len(finals) == 1
    return finals[0]


def trainer_of(job_id: UUID) -> psutil.Process:
    """The training command (not its launcher) of the job's running learner."""
    for process in psutil.process_iter(["cmdline"]):
        try:
            training = "runners.examples.classifier" in " ".join(process.info["cmdline"] or [])
            if training and process.environ().get("TRAINYARD_JOB_ID") == str(job_id):
                return process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise LookupError(f"no trainer of job {job_id}")


async def test_a_killed_learner_resumes_from_its_checkpoint_with_the_same_result(
    plane: Plane, agent: RunningAgent
) -> None:
    interval = {"checkpoint": {"interval_seconds": 1, "keep": 3}, "gpus_per_learner": 0}
    reference = await plane.submit(TRAIN, **interval)
    await plane.state(reference, JobStatus.COMPLETED)

    job_id = await plane.submit(TRAIN, **interval)

    async def checkpointed() -> bool:
        history = await plane.store.read_stream(f"job-{job_id}")
        return any(isinstance(e.event, CheckpointSaved) for e in history)

    await eventually(checkpointed, seconds=60)
    os.kill(trainer_of(job_id).pid, signal.SIGKILL)

    job = await plane.state(job_id, JobStatus.COMPLETED)
    assert job.attempt == 2 and job.restarts == 1
    restart = next(t for t in job.transitions if t.state is JobStatus.QUEUED and t.attempt == 2)
    assert restart.reason == "learner 0 killed by SIGKILL"

    # The second attempt restored the first attempt's last checkpoint: not step zero.
    history = await plane.store.read_stream(f"job-{job_id}")
    saved_first = [
        e.event.step
        for e in history
        if isinstance(e.event, CheckpointSaved) and e.event.attempt == 1
    ]
    restored = [
        report.step
        for line in await plane.log_text(job_id)
        if isinstance(report := protocol.parse(line), protocol.CheckpointRestored)
    ]
    assert restored and restored[0] > 0
    assert restored[0] in saved_first
    # Deterministic resume: the same final loss as the run that was never interrupted.
    assert abs(await final_loss(plane, job_id) - await final_loss(plane, reference)) < 1e-6
