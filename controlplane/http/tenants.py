"""`/v1/tenants`: the admin creates tenants, lists them, changes their weight, GPU quota and
limits, and issues and revokes their bearer tokens. A new token is in the response once, never
again. The handlers route and authenticate (every route is the admin's); the tenants feature's
facade (`controlplane.tenants.application`) decides.
"""

from __future__ import annotations

from aiohttp import web

from controlplane.http import params
from controlplane.http.auth import principal
from controlplane.http.errors import error
from controlplane.http.keys import PLANE
from controlplane.http.operations import (
    Answer,
    Operation,
    Param,
    add_operations,
    answer,
    links,
)
from controlplane.http.requests import json_body, validated
from controlplane.tenants.application import TenantsApplication
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.requests import TenantCreate, TenantUpdate, TokenRequest
from controlplane.tenants.views import CreatedTenant, IssuedTokenView, TenantList, TenantView

TENANTS_APPLICATION = web.AppKey("tenants_application", TenantsApplication)


def _admin_only(request: web.Request) -> TenantsApplication:
    """The facade, for the admin's token only (checked before the body is read)."""
    if not principal(request).is_admin:
        raise error(403, "only the admin token may manage tenants")
    return request.app[TENANTS_APPLICATION]


async def list_all(request: web.Request) -> web.Response:
    return answer(await _admin_only(request).list())


async def get_one(request: web.Request) -> web.Response:
    return answer(await _admin_only(request).get(request.match_info["name"]))


async def create(request: web.Request) -> web.Response:
    tenants = _admin_only(request)
    body = validated(TenantCreate, await json_body(request))
    created = await tenants.create(body)
    return answer(created, status=201, headers={"Location": f"/v1/tenants/{body.name}"})


async def update(request: web.Request) -> web.Response:
    tenants = _admin_only(request)
    body = validated(TenantUpdate, await json_body(request))
    return answer(await tenants.update(request.match_info["name"], body))


async def get_limits(request: web.Request) -> web.Response:
    return answer(await _admin_only(request).limits(request.match_info["name"]))


async def put_limits(request: web.Request) -> web.Response:
    tenants = _admin_only(request)
    # Validated whole first, so that a bad value is a 422 naming its field.
    body = validated(TenantLimits, await json_body(request))
    return answer(await tenants.set_limits(request.match_info["name"], body))


async def issue(request: web.Request) -> web.Response:
    tenants = _admin_only(request)
    body = validated(TokenRequest, await json_body(request))
    return answer(await tenants.issue_token(request.match_info["name"], body), status=201)


async def revoke(request: web.Request) -> web.Response:
    tenants = _admin_only(request)
    token_id = params.text(request.match_info["token_id"], "token_id", max_length=100)
    await tenants.revoke_token(request.match_info["name"], token_id)
    return web.Response(status=204)


NAME = Param("name", "path", "the tenant's name", {"type": "string"})
ADMIN = {401: "missing or wrong token", 403: "not the admin token"}
NOT_FOUND = "no such tenant"
OPERATIONS = (
    Operation(
        "get",
        "/v1/tenants",
        list_all,
        "listTenants",
        "List tenants with their weights, quotas and live token ids (admin)",
        {200: Answer("every tenant", TenantList)},
        ADMIN,
    ),
    Operation(
        "post",
        "/v1/tenants",
        create,
        "createTenant",
        "Create a tenant and its first token (admin)",
        {
            201: Answer(
                "the tenant and its token, shown only this once",
                CreatedTenant,
                links=links(
                    "name",
                    "getTenant",
                    "updateTenant",
                    "getTenantLimits",
                    "setTenantLimits",
                    "issueToken",
                    at="/tenant/name",
                ),
            )
        },
        {
            400: "malformed JSON",
            **ADMIN,
            409: "the tenant exists already",
            422: "invalid fields, each listed",
        },
        body=TenantCreate,
        body_required=True,
    ),
    Operation(
        "get",
        "/v1/tenants/{name}",
        get_one,
        "getTenant",
        "One tenant (admin)",
        {200: Answer("the tenant", TenantView)},
        {**ADMIN, 404: NOT_FOUND},
        params=(NAME,),
    ),
    Operation(
        "patch",
        "/v1/tenants/{name}",
        update,
        "updateTenant",
        "Change a tenant's weight or GPU quota (gpu_quota null: no quota)",
        {200: Answer("the tenant as it is now", TenantView)},
        {
            400: "malformed JSON",
            **ADMIN,
            404: NOT_FOUND,
            409: "the tenant kept changing; retry",
            422: "invalid fields, each listed; or none given",
        },
        description="Claims use the new values at once. Fields left out (or a null weight) "
        "stay as they are.",
        params=(NAME,),
        body=TenantUpdate,
        body_required=True,
    ),
    Operation(
        "get",
        "/v1/tenants/{name}/limits",
        get_limits,
        "getTenantLimits",
        "A tenant's limits (admin); those never set are the defaults",
        {200: Answer("the tenant's limits", TenantLimits)},
        {**ADMIN, 404: NOT_FOUND},
        params=(NAME,),
    ),
    Operation(
        "put",
        "/v1/tenants/{name}/limits",
        put_limits,
        "setTenantLimits",
        "Set some of a tenant's limits (admin); those left out stay",
        {200: Answer("the tenant's limits now", TenantLimits)},
        {
            400: "malformed JSON",
            **ADMIN,
            404: NOT_FOUND,
            409: "the tenant kept changing; retry",
            422: "invalid fields, each listed; or none given",
        },
        description="Submissions and streams use the new limits at once; jobs submitted "
        "earlier keep the log and report limits they were accepted with. Limits and their "
        "defaults: docs/user-guide.md, section Limits.",
        params=(NAME,),
        body=TenantLimits,
        body_required=True,
    ),
    Operation(
        "post",
        "/v1/tenants/{name}/tokens",
        issue,
        "issueToken",
        "Issue another token for a tenant; optionally revoke all its others",
        {201: Answer("the token, shown only this once", IssuedTokenView)},
        {
            400: "malformed JSON",
            **ADMIN,
            404: NOT_FOUND,
            409: "the tenant kept changing; retry",
            422: "invalid fields, each listed",
        },
        params=(NAME,),
        body=TokenRequest,
    ),
    Operation(
        "delete",
        "/v1/tenants/{name}/tokens/{token_id}",
        revoke,
        "revokeToken",
        "Revoke one token at once (requests with it get 401 from then on)",
        {204: Answer("revoked")},
        {
            400: "malformed token_id: over 100 characters, or not text",
            **ADMIN,
            404: "no such tenant, or no active token of that id",
            409: "the tenant kept changing; retry",
        },
        params=(
            NAME,
            Param("token_id", "path", "the token's id", params.text_schema(max_length=100)),
        ),
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
    app.on_startup.append(_open)


async def _open(app: web.Application) -> None:
    # After the composition root's parts are open (cleanup contexts start first).
    plane = app[PLANE]
    app[TENANTS_APPLICATION] = TenantsApplication(
        plane.pool, plane.store, plane.projections, plane.clock
    )
