"""What one tenant may use of what all share: its limits, their defaults, and the part of them
that each job it submits carries (`JobLimits`).

A tenant that the admin never gave limits has the defaults below (docs/user-guide.md's "Limits"
lists them); `TenantLimitsSet` on its stream records every change, with all the limits as they are
from then on.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from controlplane.jobs.limits import (
    DEFAULT_LOG_BYTES,
    DEFAULT_LOG_LINES,
    DEFAULT_REPORTS_PER_S,
    JobLimits,
)

DEFAULT_STREAMS = 32
DEFAULT_SUBMISSIONS_PER_S = 5.0
DEFAULT_SUBMISSION_BURST = 50
DEFAULT_QUEUED_JOBS = 1000
# Far above what a queue of DEFAULT_QUEUED_JOBS ordinary jobs asks for: the defaults bound a
# runaway, the admin sets what a tenant's share is.
DEFAULT_CPUS = 65_536.0
DEFAULT_MEMORY_MB = 1 << 30
DEFAULT_DEPLOYMENTS = 20
DEFAULT_REPLICAS = 64
DEFAULT_SEARCHES = 20
DEFAULT_QUEUED_PREDICTIONS = 100_000
DEFAULT_ARTIFACT_BYTES = 256 * 1024**3


class TenantLimits(BaseModel):
    # As a body (PUT .../limits) an empty one changes nothing and is refused: the schema says
    # so (as an answer it names every limit).
    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra={"minProperties": 1})

    streams: int = Field(
        default=DEFAULT_STREAMS,
        ge=1,
        le=100_000,
        description="live SSE streams (job events and log follows) the tenant may hold open at "
        "once on one control plane",
    )
    submissions_per_s: float = Field(
        default=DEFAULT_SUBMISSIONS_PER_S,
        gt=0,
        le=100_000,
        allow_inf_nan=False,
        description="sustained job submissions per second (a token bucket per control plane)",
    )
    submission_burst: int = Field(
        default=DEFAULT_SUBMISSION_BURST,
        ge=1,
        le=100_000,
        description="submissions accepted at once before `submissions_per_s` applies",
    )
    queued_jobs: int = Field(
        default=DEFAULT_QUEUED_JOBS,
        ge=1,
        le=10_000_000,
        description="jobs the tenant may have QUEUED (accepted, not yet running) at once",
    )
    cpus: float = Field(
        default=DEFAULT_CPUS,
        ge=0,
        le=10_000_000,
        allow_inf_nan=False,
        description="CPUs the tenant's live jobs (QUEUED or running, a deployment's replicas "
        "included) ask for in all (learners x cpus)",
    )
    memory_mb: int = Field(
        default=DEFAULT_MEMORY_MB,
        ge=0,
        le=1 << 40,
        description="memory (MiB) the tenant's live jobs ask for in all (learners x memory_mb)",
    )
    deployments: int = Field(
        default=DEFAULT_DEPLOYMENTS,
        ge=0,
        le=100_000,
        description="deployments the tenant may have (created, not deleted)",
    )
    replicas: int = Field(
        default=DEFAULT_REPLICAS,
        ge=0,
        le=1_000_000,
        description="replicas the tenant's deployments may ask for in all",
    )
    searches: int = Field(
        default=DEFAULT_SEARCHES,
        ge=0,
        le=100_000,
        description="searches the tenant may have running at once",
    )
    queued_predictions: int = Field(
        default=DEFAULT_QUEUED_PREDICTIONS,
        ge=0,
        le=1_000_000_000,
        description="prediction items the tenant may have waiting or running at once (its "
        "tasks not yet finished, synchronous and asynchronous)",
    )
    artifact_bytes: int = Field(
        default=DEFAULT_ARTIFACT_BYTES,
        ge=0,
        le=1 << 50,
        description="bytes of model artifacts the tenant's model versions may hold in all",
    )
    log_lines: int = Field(
        default=DEFAULT_LOG_LINES,
        ge=1,
        le=1_000_000_000,
        description="log lines one job may store (all its attempts); then a marker",
    )
    log_bytes: int = Field(
        default=DEFAULT_LOG_BYTES,
        ge=1,
        le=1 << 40,
        description="bytes of log text one job may store (all its attempts); then a marker",
    )
    reports_per_s: float = Field(
        default=DEFAULT_REPORTS_PER_S,
        gt=0,
        le=10_000,
        allow_inf_nan=False,
        description="checkpoint reports per second a job's learners may turn into events "
        "(per attempt and node, with a burst of 10 seconds' worth); more are not recorded",
    )

    def for_job(self) -> JobLimits:
        """The limits a job submitted now is accepted with."""
        return JobLimits(
            log_lines=self.log_lines, log_bytes=self.log_bytes, reports_per_s=self.reports_per_s
        )
