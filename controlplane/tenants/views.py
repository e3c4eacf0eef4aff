"""Read-model queries over the tenants: their limits and what a submission is checked against."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.database import Executor
from controlplane.queries import Q
from controlplane.tenants.limits import TenantLimits


@dataclass(frozen=True, slots=True)
class SubmissionCheck:
    """What a tenant's next submission is checked against."""

    limits: TenantLimits
    queued: int
    """The tenant's jobs QUEUED now (from the status view, which may lag the log a moment)."""
    largest_memory_mb: int | None
    """The most memory any node ever registered has; None: no node yet."""


async def submission_check(db: Executor, tenant: str) -> SubmissionCheck | None:
    """The tenant's limits, queued jobs and the largest node's memory, in one round trip; None
    when there is no such tenant."""
    row = await db.fetchrow(Q["tenant_submission_limits"], tenant)
    if row is None:
        return None
    return SubmissionCheck(
        limits=TenantLimits.model_validate_json(row["limits"]),
        queued=row["queued"],
        largest_memory_mb=row["largest_memory_mb"],
    )


async def tenant_limits(db: Executor, tenant: str) -> TenantLimits | None:
    """The tenant's limits (the defaults where none were set); None when there is no such
    tenant."""
    raw = await db.fetchval(Q["tenant_limits"], tenant)
    return None if raw is None else TenantLimits.model_validate_json(raw)
