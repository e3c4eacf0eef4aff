"""A job's training metrics: the learners' metric reports, read back from their stored lines.

Learners report metrics as protocol lines on stdout (`runners.metrics.log`); the log pipeline
stores them with every other line, so metrics need no store of their own and are complete
exactly when the logs are.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from controlplane.database import Executor
from controlplane.queries import Q
from runners import protocol


@dataclass(frozen=True, slots=True)
class MetricPoint:
    attempt: int
    learner: int
    step: int
    at: datetime
    values: dict[str, float]


async def read_metrics(db: Executor, job_id: UUID) -> list[MetricPoint]:
    points = []
    for row in await db.fetch(Q["job_metric_lines"], job_id):
        report = protocol.parse(row["line"])
        if isinstance(report, protocol.Metric):
            points.append(
                MetricPoint(row["attempt"], row["learner"], report.step, report.at, report.values)
            )
    return points
