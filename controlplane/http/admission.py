"""The admission policy at the HTTP edge: every command that takes room asks for it here, before
anything is written (see controlplane/admission)."""

from __future__ import annotations

from aiohttp import web

from controlplane.admission.policy import Room, refusal
from controlplane.admission.usage import Usage, prediction_usage, tenant_usage
from controlplane.http.errors import error
from controlplane.http.keys import POOL
from controlplane.instruments import LIMIT_REFUSALS


async def usage_of(request: web.Request, tenant: str) -> Usage:
    """The tenant's limits and holdings; 422 naming `tenant` when there is no such tenant."""
    usage = await tenant_usage(request.app[POOL], tenant)
    if usage is None:
        raise error(422, f"no tenant named {tenant!r}", field="tenant")
    return usage


def hold(tenant: str, usage: Usage, asked: Room) -> None:
    """Nothing when `asked` fits beside what the tenant holds; else the refusal (422 or 429
    naming the limit), counted in trainyard_limits_refused_total."""
    refused = refusal(tenant, usage.limits, usage.held, asked)
    if refused is not None:
        LIMIT_REFUSALS.add(1, {"limit": refused.field, "tenant": tenant})
        raise error(refused.status, refused.message, field=refused.field)


async def admit_room(request: web.Request, tenant: str, asked: Room) -> Usage:
    """`hold` with the tenant's usage read now; the usage, once admitted."""
    usage = await usage_of(request, tenant)
    hold(tenant, usage, asked)
    return usage


async def admit_predictions(request: web.Request, tenant: str, items: int) -> None:
    """`admit_room` for `items` prediction items, reading only what they are checked against."""
    usage = await prediction_usage(request.app[POOL], tenant)
    if usage is None:
        raise error(422, f"no tenant named {tenant!r}", field="tenant")
    hold(tenant, usage, Room(queued_predictions=items))
