"""Read-model queries over the tenants: their limits."""

from __future__ import annotations

from controlplane.database import Executor
from controlplane.queries import Q
from controlplane.tenants.limits import TenantLimits


async def tenant_limits(db: Executor, tenant: str) -> TenantLimits | None:
    """The tenant's limits (the defaults where none were set); None when there is no such
    tenant."""
    raw = await db.fetchval(Q["tenant_limits"], tenant)
    return None if raw is None else TenantLimits.model_validate_json(raw)
