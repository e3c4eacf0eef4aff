"""The admission policy applied: every command that takes room asks here, before anything is
written (see `admission.policy`); a refusal is counted in trainyard_limits_refused_total."""

from __future__ import annotations

from controlplane.admission.policy import Room, refusal
from controlplane.admission.usage import Usage, prediction_usage, tenant_usage
from controlplane.database import Executor
from controlplane.instruments import LIMIT_REFUSALS
from controlplane.refusals import Refusal, Refused


def _no_tenant(tenant: str) -> Refusal:
    return Refusal(Refused.INVALID, f"no tenant named {tenant!r}", field="tenant")


async def usage_of(db: Executor, tenant: str) -> Usage:
    """The tenant's limits and holdings; refused (naming `tenant`) when there is no such tenant."""
    usage = await tenant_usage(db, tenant)
    if usage is None:
        raise _no_tenant(tenant)
    return usage


def hold(tenant: str, usage: Usage, asked: Room) -> None:
    """Nothing when `asked` fits beside what the tenant holds; else the refusal naming the
    limit."""
    refused = refusal(tenant, usage.limits, usage.held, asked)
    if refused is not None:
        LIMIT_REFUSALS.add(1, {"limit": refused.field or "", "tenant": tenant})
        raise refused


async def admit(db: Executor, tenant: str, asked: Room) -> Usage:
    """`hold` with the tenant's usage read now; the usage, once admitted."""
    usage = await usage_of(db, tenant)
    hold(tenant, usage, asked)
    return usage


async def admit_predictions(db: Executor, tenant: str, items: int) -> None:
    """`admit` for `items` prediction items, reading only what they are checked against."""
    usage = await prediction_usage(db, tenant)
    if usage is None:
        raise _no_tenant(tenant)
    hold(tenant, usage, Room(queued_predictions=items))
