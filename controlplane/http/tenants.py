"""`/v1/tenants`: the admin creates tenants, lists them, changes their weight, GPU quota and
limits, and issues and revokes their bearer tokens. A new token is in the response once, never
again.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane.http import params
from controlplane.http.auth import principal
from controlplane.http.errors import error
from controlplane.http.keys import PLANE, POOL, PROJECTIONS, STORE
from controlplane.http.operations import links
from controlplane.http.requests import json_body, validated
from controlplane.tenants.errors import (
    InvalidTenant,
    TenantBusy,
    TenantError,
    TenantExists,
    UnknownTenant,
    UnknownToken,
)
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.service import (
    KEEP,
    TenantSummary,
    create_tenant,
    issue_token,
    list_tenants,
    revoke_token,
    set_limits,
    update_tenant,
)
from controlplane.tenants.tokens import IssuedToken
from controlplane.tenants.validation import NAME

ACTOR = "admin"

_STATUS: dict[type[TenantError], int] = {
    InvalidTenant: 422,
    TenantExists: 409,
    TenantBusy: 409,
    UnknownTenant: 404,
    UnknownToken: 404,
}


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=f"^{NAME.pattern}$", description="lowercase letters, digits, '-'")
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="cluster share")
    gpu_quota: int | None = Field(
        default=None, ge=0, le=params.INT4_MAX, description="most GPUs held at once"
    )


class TenantUpdate(BaseModel):
    """The settings to change; a `gpu_quota` of null removes the quota."""

    # An empty body changes nothing, and `update` refuses it: the schema says so.
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    weight: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    gpu_quota: int | None = Field(default=None, ge=0, le=params.INT4_MAX)


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    revoke_others: bool = Field(default=False, description="revoke every other token (rotation)")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/tenants", list_all)
    app.router.add_post("/v1/tenants", create)
    app.router.add_get("/v1/tenants/{name}", get_one)
    app.router.add_patch("/v1/tenants/{name}", update)
    app.router.add_get("/v1/tenants/{name}/limits", get_limits)
    app.router.add_put("/v1/tenants/{name}/limits", put_limits)
    app.router.add_post("/v1/tenants/{name}/tokens", issue)
    app.router.add_delete("/v1/tenants/{name}/tokens/{token_id}", revoke)


def tenant_view(tenant: TenantSummary) -> dict[str, Any]:
    return {
        "name": tenant.name,
        "weight": tenant.weight,
        "gpu_quota": tenant.gpu_quota,
        "created_at": tenant.created_at.isoformat(),
        "active_tokens": list(tenant.active_tokens),
        "limits": tenant.limits.model_dump(mode="json"),
    }


def _token_view(name: str, token: IssuedToken) -> dict[str, str]:
    return {"tenant": name, "token_id": token.token_id, "token": token.plaintext}


def _admin_only(request: web.Request) -> None:
    if not principal(request).is_admin:
        raise error(403, "only the admin token may manage tenants")


def _refused(exc: TenantError) -> web.HTTPException:
    return error(_STATUS[type(exc)], str(exc))


async def _body(request: web.Request, model: type[BaseModel]) -> Any:
    return validated(model, await json_body(request))


def _name(request: web.Request) -> str:
    """The tenant named in the path; one that no tenant could have is not looked up."""
    name = request.match_info["name"]
    if not NAME.fullmatch(name):
        raise error(404, f"no tenant named {name!r}")
    return name


async def _tenant(request: web.Request, name: str) -> dict[str, Any]:
    found = await list_tenants(request.app[POOL], name)
    if not found:
        raise error(404, f"no tenant named {name!r}")
    return tenant_view(found[0])


async def list_all(request: web.Request) -> web.Response:
    _admin_only(request)
    tenants = await list_tenants(request.app[POOL])
    return web.json_response({"tenants": [tenant_view(t) for t in tenants]})


async def get_one(request: web.Request) -> web.Response:
    _admin_only(request)
    return web.json_response(await _tenant(request, _name(request)))


async def create(request: web.Request) -> web.Response:
    _admin_only(request)
    body: TenantCreate = await _body(request, TenantCreate)
    app = request.app
    try:
        token = await create_tenant(
            app[STORE],
            app[PROJECTIONS],
            body.name,
            body.weight,
            body.gpu_quota,
            actor=ACTOR,
            clock=app[PLANE].clock,
        )
    except TenantError as exc:
        raise _refused(exc) from exc
    return web.json_response(
        {**_token_view(body.name, token), "tenant": await _tenant(request, body.name)},
        status=201,
        headers={"Location": f"/v1/tenants/{body.name}"},
    )


async def update(request: web.Request) -> web.Response:
    _admin_only(request)
    body: TenantUpdate = await _body(request, TenantUpdate)
    if not body.model_fields_set:
        raise error(422, "nothing to change: give weight, gpu_quota or both")
    name = _name(request)
    app = request.app
    try:
        await update_tenant(
            app[STORE],
            app[PROJECTIONS],
            name,
            weight=KEEP if body.weight is None else body.weight,
            gpu_quota=body.gpu_quota if "gpu_quota" in body.model_fields_set else KEEP,
            actor=ACTOR,
        )
    except TenantError as exc:
        raise _refused(exc) from exc
    return web.json_response(await _tenant(request, name))


async def get_limits(request: web.Request) -> web.Response:
    _admin_only(request)
    return web.json_response((await _tenant(request, request.match_info["name"]))["limits"])


async def put_limits(request: web.Request) -> web.Response:
    """Set the limits the body names; those it leaves out stay as they are."""
    _admin_only(request)
    # Validated whole first, so that a bad value is a 422 naming its field; the omitted
    # fields' defaults are not changes.
    body: TenantLimits = await _body(request, TenantLimits)
    if not body.model_fields_set:
        raise error(
            422, f"no limit to change: give one or more of {', '.join(TenantLimits.model_fields)}"
        )
    changes = body.model_dump(include=body.model_fields_set)
    name = _name(request)
    app = request.app
    try:
        await set_limits(app[STORE], app[PROJECTIONS], name, changes, actor=ACTOR)
    except TenantError as exc:
        raise _refused(exc) from exc
    return web.json_response((await _tenant(request, name))["limits"])


async def issue(request: web.Request) -> web.Response:
    _admin_only(request)
    body: TokenRequest = await _body(request, TokenRequest)
    name = _name(request)
    app = request.app
    try:
        token = await issue_token(
            app[STORE],
            app[PROJECTIONS],
            name,
            revoke_others=body.revoke_others,
            actor=ACTOR,
            clock=app[PLANE].clock,
        )
    except TenantError as exc:
        raise _refused(exc) from exc
    return web.json_response(_token_view(name, token), status=201)


async def revoke(request: web.Request) -> web.Response:
    _admin_only(request)
    name = _name(request)
    token_id = params.text(request.match_info["token_id"], "token_id", max_length=100)
    app = request.app
    try:
        await revoke_token(app[STORE], app[PROJECTIONS], name, token_id, actor=ACTOR)
    except TenantError as exc:
        raise _refused(exc) from exc
    return web.Response(status=204)


_REF = "#/components/schemas/"
_TENANT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "weight": {"type": "number"},
        "gpu_quota": {"type": ["integer", "null"]},
        "created_at": {"type": "string", "format": "date-time"},
        "active_tokens": {"type": "array", "items": {"type": "string"}},
        "limits": {"$ref": _REF + "TenantLimits"},
    },
    "required": ["name", "weight", "gpu_quota", "created_at", "active_tokens", "limits"],
}
_TOKEN: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tenant": {"type": "string"},
        "token_id": {"type": "string"},
        "token": {"type": "string", "description": "the bearer token, shown only this once"},
    },
    "required": ["tenant", "token_id", "token"],
}


def openapi_paths() -> dict[str, Any]:
    """The routes above; every one needs the admin token (403 for a tenant's)."""
    secured: list[dict[str, list[str]]] = [{"bearer": []}]

    def answer(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
        if schema is None:
            return {"description": description}
        return {"description": description, "content": {"application/json": {"schema": schema}}}

    def failures(*statuses: int) -> dict[str, Any]:
        reasons = {
            400: "malformed JSON",
            401: "missing or wrong token",
            403: "not the admin token",
            404: "no such tenant (or token)",
            409: "the tenant exists already",
            422: "invalid fields, each listed",
        }
        return {str(s): answer(reasons[s], {"$ref": _REF + "Error"}) for s in statuses}

    def body(model: str, *, required: bool = True) -> dict[str, Any]:
        schema = {"$ref": _REF + model}
        return {"required": required, "content": {"application/json": {"schema": schema}}}

    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
    token_id = {"name": "token_id", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "/v1/tenants": {
            "get": {
                "operationId": "listTenants",
                "summary": "List tenants with their weights, quotas and live token ids (admin)",
                "security": secured,
                "responses": {
                    "200": answer(
                        "every tenant",
                        {
                            "type": "object",
                            "properties": {"tenants": {"type": "array", "items": _TENANT}},
                        },
                    ),
                    **failures(401, 403),
                },
            },
            "post": {
                "operationId": "createTenant",
                "summary": "Create a tenant and its first token (admin)",
                "security": secured,
                "requestBody": body("TenantCreate"),
                "responses": {
                    "201": {
                        **answer(
                            "the tenant and its token, shown only this once",
                            {**_TOKEN, "properties": {**_TOKEN["properties"], "tenant": _TENANT}},
                        ),
                        "links": links(
                            "name",
                            "getTenant",
                            "updateTenant",
                            "getTenantLimits",
                            "setTenantLimits",
                            "issueToken",
                            at="/tenant/name",
                        ),
                    },
                    **failures(400, 401, 403, 409, 422),
                },
            },
        },
        "/v1/tenants/{name}": {
            "get": {
                "operationId": "getTenant",
                "summary": "One tenant (admin)",
                "security": secured,
                "parameters": [name],
                "responses": {"200": answer("the tenant", _TENANT), **failures(401, 403, 404)},
            },
            "patch": {
                "operationId": "updateTenant",
                "summary": "Change a tenant's weight or GPU quota (gpu_quota null: no quota)",
                "description": "Claims use the new values at once. Fields left out (or a null "
                "weight) stay as they are.",
                "security": secured,
                "parameters": [name],
                "requestBody": body("TenantUpdate"),
                "responses": {
                    "200": answer("the tenant as it is now", _TENANT),
                    **failures(400, 401, 403, 404, 422),
                },
            },
        },
        "/v1/tenants/{name}/limits": {
            "get": {
                "operationId": "getTenantLimits",
                "summary": "A tenant's limits (admin); those never set are the defaults",
                "security": secured,
                "parameters": [name],
                "responses": {
                    "200": answer("the tenant's limits", {"$ref": _REF + "TenantLimits"}),
                    **failures(401, 403, 404),
                },
            },
            "put": {
                "operationId": "setTenantLimits",
                "summary": "Set some of a tenant's limits (admin); those left out stay",
                "description": "Submissions and streams use the new limits at once; jobs "
                "submitted earlier keep the log and report limits they were accepted with. "
                "Limits and their defaults: docs/user-guide.md, section Limits.",
                "security": secured,
                "parameters": [name],
                "requestBody": body("TenantLimits"),
                "responses": {
                    "200": answer("the tenant's limits now", {"$ref": _REF + "TenantLimits"}),
                    **failures(400, 401, 403, 404, 422),
                },
            },
        },
        "/v1/tenants/{name}/tokens": {
            "post": {
                "operationId": "issueToken",
                "summary": "Issue another token for a tenant; optionally revoke all its others",
                "security": secured,
                "parameters": [name],
                "requestBody": body("TokenRequest", required=False),
                "responses": {
                    "201": answer("the token, shown only this once", _TOKEN),
                    **failures(400, 401, 403, 404, 422),
                },
            }
        },
        "/v1/tenants/{name}/tokens/{token_id}": {
            "delete": {
                "operationId": "revokeToken",
                "summary": "Revoke one token at once (requests with it get 401 from then on)",
                "security": secured,
                "parameters": [name, token_id],
                "responses": {"204": answer("revoked"), **failures(401, 403, 404)},
            }
        },
    }
