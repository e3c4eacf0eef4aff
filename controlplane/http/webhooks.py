"""`/v1/webhook-secret`: a tenant's webhook signing secrets, read and rotated."""

from __future__ import annotations

from aiohttp import web

from controlplane.http import params
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.errors import error
from controlplane.http.keys import PLANE, POOL, STORE
from controlplane.invariants import InvariantBroken
from controlplane.tenants.errors import TenantBusy, UnknownTenant
from controlplane.webhooks.tenant_secrets import rotate, signing_secrets

ACTION = "manages webhook secrets"


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/webhook-secret", get_secrets)
    app.router.add_post("/v1/webhook-secret", rotate_secret)


async def get_secrets(request: web.Request) -> web.Response:
    """The secrets deliveries are signed with now, the current one first (a tenant's token
    already holds every right over its jobs, so it may read what signs their notifications)."""
    who = principal(request)
    tenant = acting_tenant(who, params.text(request.query.get("tenant"), "tenant"), ACTION)
    secrets = await signing_secrets(request.app[POOL], tenant)
    if not secrets:
        raise error(
            404,
            f"tenant {tenant!r} has no webhook secret yet: POST /v1/webhook-secret issues one "
            "(the first delivery also does)",
        )
    return web.json_response(
        {
            "tenant": tenant,
            "secrets": [
                {
                    "id": s.secret_id,
                    "secret": s.secret,
                    "created_at": s.created_at.isoformat(),
                    "valid_until": None if s.valid_until is None else s.valid_until.isoformat(),
                }
                for s in secrets
            ],
        }
    )


async def rotate_secret(request: web.Request) -> web.Response:
    """Issue a new secret; the one it replaces keeps signing deliveries for a grace period."""
    who = principal(request)
    tenant = acting_tenant(who, params.text(request.query.get("tenant"), "tenant"), ACTION)
    actor = "admin" if who.is_admin else f"tenant:{tenant}"
    try:
        issued = await rotate(
            request.app[POOL],
            request.app[STORE],
            tenant,
            actor=actor,
            clock=request.app[PLANE].clock,
        )
    except UnknownTenant as exc:
        raise error(404, str(exc), field="tenant") from exc
    except TenantBusy as exc:
        raise error(409, str(exc)) from exc
    if issued is None:  # only `unless_present` rotations may issue nothing
        raise InvariantBroken(f"tenant {tenant}: a rotation issued no secret")
    until = issued.previous_valid_until
    return web.json_response(
        {
            "tenant": tenant,
            "id": issued.secret_id,
            "secret": issued.secret,
            "created_at": issued.created_at.isoformat(),
            "previous_valid_until": None if until is None else until.isoformat(),
        },
        status=201,
    )
