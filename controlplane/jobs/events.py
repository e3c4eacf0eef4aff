"""The events of a job's stream (`job-<uuid>`). Each carries the instant it happened (`at`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import Field

from controlplane.events.types import Event, registry
from controlplane.jobs.limits import JobLimits
from controlplane.jobs.manifest import JobManifest, without_reserved_env


class JobEvent(Event):
    at: datetime


@registry.register("JobSubmitted", version=2)
class JobSubmitted(JobEvent):
    """Version 2: the manifest's `env` holds no reserved names (see `manifest.RESERVED_ENV`)."""

    job_id: UUID
    tenant: str
    manifest: JobManifest
    limits: JobLimits = Field(default_factory=JobLimits)


@registry.upcaster("JobSubmitted", from_version=1)
def _reserved_env_left_out(data: dict[str, Any]) -> dict[str, Any]:
    # Version 1 accepted any name: those a manifest may no longer set are dropped, so that the
    # job still reads (and runs as its agent would have run it: with Trainyard's values).
    manifest = data.get("manifest")
    if isinstance(manifest, dict):
        return {**data, "manifest": without_reserved_env(manifest)}
    return data


@registry.register("JobDeploying")
class JobDeploying(JobEvent):
    """A node agent claimed the job and is starting its learners."""

    attempt: int
    nodes: list[str]
    gpus: list[str] = Field(description="the GPU UUIDs allocated to this attempt")
    epoch: int = Field(description="fencing token: learners of an older epoch must be killed")


@registry.register("JobDownloading")
class JobDownloading(JobEvent):
    attempt: int


@registry.register("JobProcessing")
class JobProcessing(JobEvent):
    attempt: int


@registry.register("JobStoring")
class JobStoring(JobEvent):
    attempt: int


@registry.register("JobCompleted")
class JobCompleted(JobEvent):
    attempt: int
    exit_codes: list[int]


@registry.register("JobFailed")
class JobFailed(JobEvent):
    attempt: int
    reason: str
    exit_code: int | None = None


@registry.register("JobCancelled")
class JobCancelled(JobEvent):
    reason: str


@registry.register("JobRestarted")
class JobRestarted(JobEvent):
    """The job goes back to QUEUED with its attempt raised, to resume from `resume_from`."""

    reason: str
    attempt: int = Field(description="the new attempt's number")
    resume_from: str | None = Field(description="the checkpoint the new attempt resumes from")
    not_before: datetime | None = Field(
        default=None, description="backoff: the new attempt is not claimed before this instant"
    )


@registry.register("LearnersReachedPhase")
class LearnersReachedPhase(JobEvent):
    """Some learners of a job that runs on several nodes reached a phase; the job enters it
    once all have."""

    attempt: int
    phase: str
    learners: list[int]


@registry.register("LearnersExited")
class LearnersExited(JobEvent):
    """Some learners of a job that runs on several nodes exited 0; the job completes once all
    have."""

    attempt: int
    learners: list[int]


@registry.register("DeploymentRolledBack")
class DeploymentRolledBack(JobEvent):
    """Not every learner started (in time): the started ones are stopped, and the job goes back
    to QUEUED with its attempt raised, to be deployed again (whole or not at all)."""

    reason: str
    attempt: int = Field(description="the new attempt's number")


@registry.register("CheckpointRequested")
class CheckpointRequested(JobEvent):
    """A user asked for a checkpoint now; the agent signals the learners."""


@registry.register("CheckpointSaved")
class CheckpointSaved(JobEvent):
    attempt: int
    step: int
    path: str
    size_bytes: int
    duration_s: float
