"""The limits a job runs under, fixed when it is submitted.

They come from the job's tenant's limits as they are at submission (the admin may change those
later; a job keeps the limits it was accepted with), and are recorded in its `JobSubmitted`
event, so that the agents running it enforce them without looking up the tenant.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_LOG_LINES = 1_000_000
DEFAULT_LOG_BYTES = 256 * 1024 * 1024
DEFAULT_REPORTS_PER_S = 1.0
REPORT_BURST_S = 10.0
"""A job's learners may report `reports_per_s * REPORT_BURST_S` checkpoints at once."""


class JobLimits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    log_lines: int = Field(
        default=DEFAULT_LOG_LINES, ge=1, description="lines a job's learners may log, all attempts"
    )
    log_bytes: int = Field(
        default=DEFAULT_LOG_BYTES, ge=1, description="bytes of log text a job may store"
    )
    reports_per_s: float = Field(
        default=DEFAULT_REPORTS_PER_S,
        gt=0,
        description="checkpoint reports per second the agent turns into events, per attempt and "
        "node (a forged or runaway learner cannot grow the job's stream without bound)",
    )
