"""What the API shows of a job's training metrics: every report its learners made, in the
order stored."""

from __future__ import annotations

import math
from uuid import UUID

from pydantic import BaseModel, Field, field_serializer

from controlplane.database import Executor
from controlplane.instants import Instant
from controlplane.logs.metrics import read_metrics


class MetricReport(BaseModel):
    attempt: int
    learner: int
    step: int
    at: Instant
    values: dict[str, float | str] = Field(
        description='the reported values; a non-finite one as a string ("inf", "nan")'
    )

    @field_serializer("values")
    def _finite(self, values: dict[str, float | str]) -> dict[str, float | str]:
        # JSON has no NaN or infinity (a diverging loss): they are sent as strings.
        return {
            k: str(v) if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in values.items()
        }


class JobMetrics(BaseModel):
    id: UUID
    metrics: list[MetricReport] = Field(description="every metric report, in the order stored")


async def job_metrics(db: Executor, job_id: UUID) -> JobMetrics:
    """The metrics the learners of job `job_id` reported."""
    points = await read_metrics(db, job_id)
    return JobMetrics(
        id=job_id,
        metrics=[
            MetricReport(
                attempt=p.attempt,
                learner=p.learner,
                step=p.step,
                at=p.at,
                values=dict[str, float | str](p.values),
            )
            for p in points
        ],
    )
