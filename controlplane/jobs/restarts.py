"""The restart policy: what a failed attempt becomes. Pure, so every case is testable."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.jobs.lifecycle import Fail, Job, Restart

BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0


@dataclass(frozen=True, slots=True)
class LearnerFailure:
    """How the first failing learner of an attempt ended."""

    learner: int
    description: str
    """e.g. "exited with code 1", "killed by SIGKILL"."""
    exit_code: int | None
    infrastructure: bool
    """Killed by a signal, the OOM killer or a lost node, not a choice of the user's code."""
    error: str | None = None
    """What the learner's launcher reported (a download that failed, a command not found)."""


def backoff_s(restarts: int) -> float:
    """1 s, 2 s, 4 s, … up to a minute: a crash loop does not hammer the cluster."""
    return min(BACKOFF_BASE_S * (1 << min(restarts, 16)), BACKOFF_MAX_S)


def after_failure(job: Job, failure: LearnerFailure, at: datetime) -> Restart | Fail:
    """Restart from the latest checkpoint (with backoff; past `max_restarts` the lifecycle turns
    it into FAILED), or fail fast.

    Infrastructure failures are always retried. A non-zero exit of the user's code is retried
    only under `restart_on: any_failure` (the default), and only when the job has saved a
    checkpoint: one that fails before any checkpoint, on every attempt so far, is a user error
    (a bad argument, a missing file) that restarting would only repeat, so it fails at once with
    its reason rather than burning all restarts. A failure not retried says why, and which
    manifest field would change that.
    """
    reason = f"learner {failure.learner} {failure.description}"
    if failure.error:
        reason = f"{reason}: {failure.error}"
    why_not = None if failure.infrastructure else _why_not_retried(job)
    if why_not is not None:
        return Fail(
            reason=f"{reason} ({why_not})",
            exit_code=failure.exit_code,
            at=at,
            attempt=job.attempt,
        )
    return Restart(reason=reason, at=at, backoff_s=backoff_s(job.restarts), attempt=job.attempt)


def _why_not_retried(job: Job) -> str | None:
    """Why a non-zero exit of the user's code is not retried, naming the field that would
    change that; None: it is."""
    if job.manifest.restart_on == "infrastructure":
        return (
            "restart_on is infrastructure: not retried; set restart_on: any_failure to retry a "
            "non-zero exit once the job has saved a checkpoint"
        )
    if job.last_checkpoint is None:
        return (
            "before any checkpoint: not retried; a non-zero exit is retried once the job has "
            "saved a checkpoint (checkpoint.interval_seconds sets how soon)"
        )
    return None
