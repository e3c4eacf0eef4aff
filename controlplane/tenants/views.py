"""Read-model queries over the tenants (their limits), and the views of a tenant the admin
gets."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.database import Executor
from controlplane.instants import Instant
from controlplane.queries import Q
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.service import TenantSummary


async def tenant_limits(db: Executor, tenant: str) -> TenantLimits | None:
    """The tenant's limits (the defaults where none were set); None when there is no such
    tenant."""
    raw = await db.fetchval(Q["tenant_limits"], tenant)
    return None if raw is None else TenantLimits.model_validate_json(raw)


class TenantView(BaseModel):
    """A tenant as the admin sees it."""

    name: str
    weight: float
    gpu_quota: int | None
    created_at: Instant
    active_tokens: list[str]
    """The ids of its tokens that are not revoked, oldest first."""
    limits: TenantLimits

    @classmethod
    def of(cls, tenant: TenantSummary) -> TenantView:
        return cls(
            name=tenant.name,
            weight=tenant.weight,
            gpu_quota=tenant.gpu_quota,
            created_at=tenant.created_at,
            active_tokens=list(tenant.active_tokens),
            limits=tenant.limits,
        )


class TenantList(BaseModel):
    tenants: list[TenantView]


class IssuedTokenView(BaseModel):
    tenant: str
    token_id: str
    token: str = Field(description="the bearer token, shown only this once")


class CreatedTenant(BaseModel):
    """A new tenant and its first token."""

    tenant: TenantView
    token_id: str
    token: str = Field(description="the bearer token, shown only this once")
