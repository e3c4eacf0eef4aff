"""`/v1/webhook-secret`: a tenant's webhook signing secrets, read and rotated. The handlers route
and authenticate; the facade (`controlplane.webhooks.application`) decides."""

from __future__ import annotations

from typing import Annotated

from aiohttp import web
from pydantic import Field

from controlplane.http import query
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.keys import PLANE
from controlplane.http.operations import Answer, Operation, add_operations, answer
from controlplane.webhooks.application import WebhookSecretsApplication
from controlplane.webhooks.views import IssuedSecretView, SigningSecrets

ACTION = "manages webhook secrets"
WEBHOOK_SECRETS = web.AppKey("webhook_secrets_application", WebhookSecretsApplication)


class TenantQuery(query.Query):
    tenant: Annotated[str | None, query.text()] = Field(
        default=None, description="admins only: the tenant"
    )


def _tenant(request: web.Request) -> tuple[str, str]:
    """The tenant the request acts for, and who acts (the actor its events name)."""
    who = principal(request)
    tenant = acting_tenant(who, query.parsed(request, TenantQuery).tenant, ACTION)
    return tenant, "admin" if who.is_admin else f"tenant:{tenant}"


async def get_secrets(request: web.Request) -> web.Response:
    tenant, _ = _tenant(request)
    return answer(await request.app[WEBHOOK_SECRETS].secrets(tenant))


async def rotate_secret(request: web.Request) -> web.Response:
    tenant, actor = _tenant(request)
    return answer(await request.app[WEBHOOK_SECRETS].rotate(tenant, actor=actor), status=201)


OPERATIONS = (
    Operation(
        "get",
        "/v1/webhook-secret",
        get_secrets,
        "getWebhookSecrets",
        "The tenant's webhook signing secrets",
        {200: Answer("the secrets", SigningSecrets)},
        {
            400: "malformed request: a malformed tenant, or an admin without tenant",
            401: "missing or wrong token",
            403: "a tenant's token naming another tenant",
            404: "no secret issued yet",
        },
        query=TenantQuery,
    ),
    Operation(
        "post",
        "/v1/webhook-secret",
        rotate_secret,
        "rotateWebhookSecret",
        "Issue a new webhook signing secret (rotate)",
        {201: Answer("the new secret", IssuedSecretView)},
        {
            400: "malformed request: a malformed tenant, or an admin without tenant",
            401: "missing or wrong token",
            403: "a tenant's token naming another tenant",
            404: "no such tenant",
            409: "the tenant kept changing; retry",
        },
        description="The secret it replaces keeps signing deliveries too for 24 hours (one v1 "
        "per secret in Trainyard-Signature).",
        query=TenantQuery,
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
    app.on_startup.append(_open)


async def _open(app: web.Application) -> None:
    # After the composition root's parts are open (cleanup contexts start first).
    plane = app[PLANE]
    app[WEBHOOK_SECRETS] = WebhookSecretsApplication(plane.pool, plane.store, plane.clock)
