"""The restart policy: infrastructure failures are retried with backoff, a user error before
any checkpoint fails fast, and the limit turns a restart into FAILED."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from controlplane.jobs.lifecycle import (
    Deploy,
    EnterPhase,
    Fail,
    Job,
    JobStatus,
    Refused,
    Restart,
    SaveCheckpoint,
    Submit,
    decide,
    evolve,
)
from controlplane.jobs.manifest import JobManifest, RestartOn
from controlplane.jobs.restarts import LearnerFailure, after_failure, backoff_s

T0 = datetime(2026, 11, 22, tzinfo=UTC)
KILLED = LearnerFailure(0, "killed by SIGKILL", None, infrastructure=True)
EXIT_1 = LearnerFailure(0, "exited with code 1", 1, infrastructure=False, error="bad flag")


def running(
    max_restarts: int = 3, checkpoint: bool = False, restart_on: RestartOn = "any_failure"
) -> Job:
    manifest = JobManifest(
        name="j", image="i", command=["x"], max_restarts=max_restarts, restart_on=restart_on
    )
    job: Job | None = None
    commands = [
        Submit(uuid4(), "acme", manifest, T0),
        Deploy(["n1"], [], 1, T0),
        EnterPhase(JobStatus.PROCESSING, T0),
    ]
    if checkpoint:
        commands.append(SaveCheckpoint(100, "/ckpt/100", 1, 0.1, T0))
    for command in commands:
        for event in decide(command, job):
            job = evolve(job, event)
    assert job is not None
    return job


def apply(job: Job, command: Restart | Fail) -> Job:
    for event in decide(command, job):
        job = evolve(job, event)
    return job


def test_a_killed_learner_is_restarted_with_backoff_from_its_checkpoint() -> None:
    job = running(checkpoint=True)
    command = after_failure(job, KILLED, T0)
    assert command == Restart("learner 0 killed by SIGKILL", T0, backoff_s=1.0, attempt=1)
    restarted = apply(job, command)
    assert restarted.state is JobStatus.QUEUED and restarted.attempt == 2
    assert restarted.not_before == T0 + timedelta(seconds=1)


def test_infrastructure_failures_are_retried_even_before_a_checkpoint() -> None:
    assert isinstance(after_failure(running(), KILLED, T0), Restart)


def test_a_user_error_before_any_checkpoint_fails_fast() -> None:
    command = after_failure(running(), EXIT_1, T0)
    assert command == Fail(
        reason="learner 0 exited with code 1: bad flag (before any checkpoint: not retried; a "
        "non-zero exit is retried once the job has saved a checkpoint "
        "(checkpoint.interval_seconds sets how soon))",
        exit_code=1,
        at=T0,
        attempt=1,
    )
    assert apply(running(), command).state is JobStatus.FAILED


def test_a_user_error_after_a_checkpoint_resumes_from_it() -> None:
    job = running(checkpoint=True)
    restarted = apply(job, after_failure(job, EXIT_1, T0))
    assert restarted.state is JobStatus.QUEUED
    assert restarted.transitions[-1].reason == "learner 0 exited with code 1: bad flag"


def test_restart_on_infrastructure_fails_a_non_zero_exit_even_after_a_checkpoint() -> None:
    job = running(checkpoint=True, restart_on="infrastructure")
    failed = apply(job, after_failure(job, EXIT_1, T0))
    assert failed.state is JobStatus.FAILED
    assert failed.failure_reason is not None
    assert failed.failure_reason.startswith("learner 0 exited with code 1: bad flag (")
    assert "restart_on is infrastructure: not retried" in failed.failure_reason
    assert "set restart_on: any_failure" in failed.failure_reason
    assert failed.exit_codes == [1]


def test_restart_on_infrastructure_still_retries_lost_and_killed_learners() -> None:
    job = running(restart_on="infrastructure")
    assert isinstance(after_failure(job, KILLED, T0), Restart)
    unknown = LearnerFailure(0, "gone while its agent was down", None, infrastructure=True)
    assert isinstance(after_failure(job, unknown, T0), Restart)


def test_backoff_doubles_up_to_a_minute() -> None:
    assert [backoff_s(n) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_the_restart_limit_turns_a_restart_into_failed() -> None:
    job = running(max_restarts=0)
    failed = apply(job, after_failure(job, KILLED, T0))
    assert failed.state is JobStatus.FAILED
    assert (
        failed.failure_reason
        == "restart limit (0) reached; last failure: learner 0 killed by SIGKILL "
        "(max_restarts sets the limit)"
    )


def test_a_late_report_from_an_earlier_attempt_is_refused() -> None:
    job = running(checkpoint=True)
    restarted = apply(job, after_failure(job, KILLED, T0))
    with pytest.raises(Refused, match="report from attempt 1 is stale"):
        decide(EnterPhase(JobStatus.PROCESSING, T0, attempt=1), restarted)
    with pytest.raises(Refused, match="stale"):
        decide(Restart("again", T0, attempt=1), restarted)
