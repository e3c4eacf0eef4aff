"""The events of a job's stream (`job-<uuid>`). Each carries the instant it happened (`at`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import Field

from controlplane.events.types import Event, event_type
from controlplane.jobs.limits import JobLimits
from controlplane.jobs.manifest import JobManifest, within_bounds, without_reserved_env


class JobEvent(Event):
    at: datetime


def _reserved_env_left_out(data: dict[str, Any]) -> dict[str, Any]:
    # Version 1 accepted any name: those a manifest may no longer set are dropped, so that the
    # job still reads (and runs as its agent would have run it: with Trainyard's values).
    manifest = data.get("manifest")
    if isinstance(manifest, dict):
        return {**data, "manifest": without_reserved_env(manifest)}
    return data


def _within_bounds(data: dict[str, Any]) -> dict[str, Any]:
    # Version 2 accepted any `cpus` and timeout above 0 (a subnormal one made placement
    # infinite): raised to today's floors, so that the job still reads.
    manifest = data.get("manifest")
    if isinstance(manifest, dict):
        return {**data, "manifest": within_bounds(manifest)}
    return data


@event_type(
    "JobSubmitted",
    version=5,
    upcasters={
        1: _reserved_env_left_out,
        2: _within_bounds,
        3: _reserved_env_left_out,
        4: _reserved_env_left_out,
    },
)
class JobSubmitted(JobEvent):
    """Version 2: the manifest's `env` holds no reserved names (see `manifest.RESERVED_ENV`).
    Version 3: its quantities are within today's floors (`manifest.MIN_CPUS`, ...).
    Version 4: nor torch's rendezvous names (RANK, MASTER_PORT, ...), reserved since.
    Version 5: nor the socket interface names of gloo and NCCL (`GLOO_SOCKET_IFNAME`, ...)."""

    job_id: UUID
    tenant: str
    manifest: JobManifest
    limits: JobLimits = Field(default_factory=JobLimits)


@event_type("JobDeploying")
class JobDeploying(JobEvent):
    """A node agent claimed the job and is starting its learners."""

    attempt: int
    nodes: list[str]
    gpus: list[str] = Field(description="the GPU UUIDs allocated to this attempt")
    epoch: int = Field(description="fencing token: learners of an older epoch must be killed")
    learner_nodes: list[str] = Field(
        default_factory=list,
        description="the node of each learner, by learner index (empty in events recorded "
        "before it was: their attempts' ranks show a node only when there is one)",
    )


@event_type("JobDownloading")
class JobDownloading(JobEvent):
    attempt: int


@event_type("JobProcessing")
class JobProcessing(JobEvent):
    attempt: int


@event_type("JobStoring")
class JobStoring(JobEvent):
    attempt: int


@event_type("JobCompleted")
class JobCompleted(JobEvent):
    attempt: int
    exit_codes: list[int]


@event_type("JobFailed")
class JobFailed(JobEvent):
    attempt: int
    reason: str
    exit_code: int | None = None


@event_type("JobCancelled")
class JobCancelled(JobEvent):
    reason: str


@event_type("JobRestarted")
class JobRestarted(JobEvent):
    """The job goes back to QUEUED with its attempt raised, to resume from `resume_from`."""

    reason: str
    attempt: int = Field(description="the new attempt's number")
    resume_from: str | None = Field(description="the checkpoint the new attempt resumes from")
    not_before: datetime | None = Field(
        default=None, description="backoff: the new attempt is not claimed before this instant"
    )
    preempted: bool = Field(
        default=False,
        description="stopped by its agent's stop (a drain, a SIGTERM) after its learners were "
        "asked to checkpoint, not by a failure: no restart spent",
    )


@event_type("LearnersReachedPhase")
class LearnersReachedPhase(JobEvent):
    """Some learners of a job that runs on several nodes reached a phase; the job enters it
    once all have."""

    attempt: int
    phase: str
    learners: list[int]


@event_type("LearnersExited")
class LearnersExited(JobEvent):
    """Some learners of a job that runs on several nodes exited 0; the job completes once all
    have."""

    attempt: int
    learners: list[int]


@event_type("DeploymentRolledBack")
class DeploymentRolledBack(JobEvent):
    """Not every learner started (in time): the started ones are stopped, and the job goes back
    to QUEUED with its attempt raised, to be deployed again (whole or not at all)."""

    reason: str
    attempt: int = Field(description="the new attempt's number")


@event_type("CheckpointRequested")
class CheckpointRequested(JobEvent):
    """A user asked for a checkpoint now; the agent signals the learners."""


@event_type("CheckpointSaved")
class CheckpointSaved(JobEvent):
    attempt: int
    step: int
    path: str
    size_bytes: int
    duration_s: float


EVENT_TYPES: tuple[type[Event], ...] = (
    JobSubmitted,
    JobDeploying,
    JobDownloading,
    JobProcessing,
    JobStoring,
    JobCompleted,
    JobFailed,
    JobCancelled,
    JobRestarted,
    LearnersReachedPhase,
    LearnersExited,
    DeploymentRolledBack,
    CheckpointRequested,
    CheckpointSaved,
)
"""This feature's event types, for the registry (see `controlplane.composition`)."""
