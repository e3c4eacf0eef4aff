"""What a tenant holds now, read from the projections, for the admission policy."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.admission.policy import Room
from controlplane.database import Executor
from controlplane.queries import Q
from controlplane.tenants.limits import TenantLimits


@dataclass(frozen=True, slots=True)
class Usage:
    """A tenant's limits and what it holds now. The read models may lag the log by a moment:
    commands racing each other may pass a limit by a few."""

    limits: TenantLimits
    held: Room
    largest_memory_mb: int | None
    """The most memory any node ever registered has; None: no node yet."""


async def tenant_usage(db: Executor, tenant: str) -> Usage | None:
    """The tenant's limits and holdings in one round trip; None when there is no such tenant."""
    row = await db.fetchrow(Q["tenant_usage"], tenant)
    if row is None:
        return None
    held = Room(
        queued_jobs=row["queued_jobs"],
        cpus=row["cpus"],
        memory_mb=row["memory_mb"],
        deployments=row["deployments"],
        replicas=row["replicas"],
        searches=row["searches"],
        queued_predictions=row["queued_predictions"],
        artifact_bytes=row["artifact_bytes"],
    )
    limits = TenantLimits.model_validate_json(row["limits"])
    return Usage(limits, held, row["largest_memory_mb"])


async def prediction_usage(db: Executor, tenant: str) -> Usage | None:
    """`tenant_usage` with only the prediction items held read (the rest left 0): what a
    prediction asks for, read cheaply on its synchronous path."""
    row = await db.fetchrow(Q["tenant_prediction_usage"], tenant)
    if row is None:
        return None
    limits = TenantLimits.model_validate_json(row["limits"])
    return Usage(limits, Room(queued_predictions=row["queued_predictions"]), None)
