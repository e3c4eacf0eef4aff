"""`/v1/tenants` (admin only) and `trainyard tenants …` over it: create, list, change weight
and quota, issue and revoke tokens; bad input writes nothing; documented exit codes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.http.app import create_app
from controlplane.tenants.principals import Principal, Principals
from controlplane.tenants.tokens import PREFIX
from tests.tenancy import Cli, Tokens, auth, event_count

Client = TestClient[web.Request, web.Application]
authenticate = Principals().authenticate
"""A process's lookups of its own, besides the server's (which a revocation must reach too)."""


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(db_url, poll_interval=0.2))) as client:
        yield client


async def test_the_admin_manages_tenants_and_their_tokens(
    client: Client, tokens: Tokens, pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    admin = auth(tokens.admin)
    created = await client.post(
        "/v1/tenants", json={"name": "initech", "weight": 2, "gpu_quota": 4}, headers=admin
    )
    assert created.status == 201
    assert created.headers["Location"] == "/v1/tenants/initech"
    body = await created.json()
    assert body["tenant"]["name"] == "initech"
    assert (body["tenant"]["weight"], body["tenant"]["gpu_quota"]) == (2, 4)
    assert body["tenant"]["active_tokens"] == [body["token_id"]]
    initech = Principal(tenant="initech", is_admin=False)
    assert await authenticate(pool, body["token"]) == initech

    listed = await (await client.get("/v1/tenants", headers=admin)).json()
    assert [t["name"] for t in listed["tenants"]] == ["acme", "globex", "initech"]

    changed = await client.patch("/v1/tenants/initech", json={"weight": 0.5}, headers=admin)
    assert changed.status == 200
    assert ((await changed.json())["weight"], (await changed.json())["gpu_quota"]) == (0.5, 4)
    unlimited = await client.patch("/v1/tenants/initech", json={"gpu_quota": None}, headers=admin)
    assert (await unlimited.json())["gpu_quota"] is None
    one = await (await client.get("/v1/tenants/initech", headers=admin)).json()
    assert (one["weight"], one["gpu_quota"]) == (0.5, None)
    audited = await owner.fetch(
        "SELECT actor, action FROM audit.actions WHERE tenant = 'initech' ORDER BY position"
    )
    assert [tuple(r) for r in audited] == [
        ("admin", "tenant_create"),
        ("admin", "token_issue"),
        ("admin", "tenant_update"),
        ("admin", "tenant_update"),
    ]

    issued = await client.post(
        "/v1/tenants/initech/tokens", json={"revoke_others": True}, headers=admin
    )
    assert issued.status == 201
    rotated = await issued.json()
    assert rotated["token"].startswith(PREFIX) and rotated["tenant"] == "initech"
    assert await authenticate(pool, body["token"]) is None
    # The server trusts a live token it looked up for a moment; its revocation still takes
    # effect once it returns.
    own = {"Authorization": f"Bearer {rotated['token']}"}
    assert (await client.get("/v1/jobs", headers=own)).status == 200
    revoked = await client.delete(
        f"/v1/tenants/initech/tokens/{rotated['token_id']}", headers=admin
    )
    assert revoked.status == 204
    assert (await client.get("/v1/jobs", headers=own)).status == 401
    assert await authenticate(pool, rotated["token"]) is None


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("POST", "/v1/tenants", {"name": "Acme!"}, 422, "name"),
        ("POST", "/v1/tenants", {"name": "x", "weight": 0}, 422, "weight"),
        ("POST", "/v1/tenants", {"name": "x", "gpu_quota": -1}, 422, "gpu_quota"),
        ("POST", "/v1/tenants", {"name": "x", "colour": "red"}, 422, "colour"),
        ("POST", "/v1/tenants", {"name": "acme"}, 409, "tenant 'acme' already exists"),
        ("PATCH", "/v1/tenants/acme", {}, 422, "nothing to change"),
        ("PATCH", "/v1/tenants/acme", {"weight": -2}, 422, "weight"),
        ("PATCH", "/v1/tenants/nobody", {"weight": 2}, 404, "no tenant named 'nobody'"),
        ("GET", "/v1/tenants/nobody", None, 404, "no tenant named 'nobody'"),
        ("POST", "/v1/tenants/nobody/tokens", {}, 404, "no tenant named 'nobody'"),
        ("DELETE", "/v1/tenants/acme/tokens/nope", None, 404, "no active token 'nope'"),
    ],
)
async def test_bad_tenant_requests_are_refused_and_write_nothing(
    client: Client,
    tokens: Tokens,
    owner: asyncpg.Connection,
    method: str,
    path: str,
    body: Any,
    status: int,
    message: str,
) -> None:
    before = await event_count(owner)
    response = await client.request(method, path, json=body, headers=auth(tokens.admin))
    assert response.status == status
    assert message in await response.text()
    assert await event_count(owner) == before


async def test_only_the_admin_may_manage_tenants(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    before = await event_count(owner)
    acme = auth(tokens.acme)
    for method, path in [
        ("GET", "/v1/tenants"),
        ("POST", "/v1/tenants"),
        ("GET", "/v1/tenants/acme"),
        ("PATCH", "/v1/tenants/acme"),
        ("POST", "/v1/tenants/acme/tokens"),
        ("DELETE", "/v1/tenants/acme/tokens/x"),
    ]:
        response = await client.request(method, path, json={"weight": 9}, headers=acme)
        assert response.status == 403, (method, path)
        assert (await client.request(method, path)).status == 401
    assert await event_count(owner) == before


async def test_every_tenant_route_is_in_the_openapi_document(client: Client) -> None:
    paths = (await (await client.get("/openapi.json")).json())["paths"]
    assert set(paths["/v1/tenants"]) == {"get", "post"}
    assert set(paths["/v1/tenants/{name}"]) == {"get", "patch"}
    assert set(paths["/v1/tenants/{name}/tokens"]) == {"post"}
    assert set(paths["/v1/tenants/{name}/tokens/{token_id}"]) == {"delete"}
    assert set(paths["/metrics"]) == {"get"}


async def test_the_cli_manages_tenants_and_prints_each_token_once(
    cli: Cli, pool: asyncpg.Pool
) -> None:
    acme = Principal(tenant="acme", is_admin=False)
    code, out, err = await cli("create", "acme", "--weight", "2")
    assert code == 0, err
    token = out.strip()
    assert out == token + "\n" and token.startswith(PREFIX)
    assert token not in err
    assert "created tenant acme" in err
    assert await authenticate(pool, token) == acme

    code, out, err = await cli("token", "acme", "--revoke-others")
    assert code == 0, err
    rotated = out.strip()
    assert await authenticate(pool, token) is None
    assert await authenticate(pool, rotated) == acme

    code, out, err = await cli("set", "acme", "--gpu-quota", "8")
    assert (code, out) == (0, "tenant acme: weight 2, GPU quota 8\n"), err
    code, out, err = await cli("set", "acme", "--weight", "0.5", "--no-gpu-quota")
    assert (code, out) == (0, "tenant acme: weight 0.5, GPU quota none\n"), err

    code, out, err = await cli("list")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["NAME", "WEIGHT", "GPU", "QUOTA", "CREATED", "ACTIVE", "TOKENS"]
    assert row.split()[:3] == ["acme", "0.5", "-"]
    code, out, err = await cli("list", "--output", "json")
    [listed] = json.loads(out)
    assert (listed["name"], listed["weight"], listed["gpu_quota"]) == ("acme", 0.5, None)
    [token_id] = listed["active_tokens"]

    code, out, err = await cli("revoke", "acme", token_id)
    assert (code, out) == (0, f"revoked token {token_id} of tenant acme\n"), err
    assert await authenticate(pool, rotated) is None


CLI_REFUSALS = [
    (["create", "Acme"], 2, "invalid tenant name 'Acme'"),
    (["create", "acme", "--weight", "-1"], 2, "invalid weight -1.0"),
    (["create", "acme", "--weight", "lots"], 2, "invalid weight 'lots'"),
    (["create", "acme", "--gpu-quota", "-2"], 2, "invalid GPU quota -2"),
    (["set", "taken"], 2, "nothing to change"),
    (["set", "taken", "--gpu-quota", "1", "--no-gpu-quota"], 2, "not both"),
    (["create", "taken"], 1, "tenant 'taken' already exists; nothing was written"),
    (["token", "nobody"], 4, "no tenant named 'nobody'"),
    (["set", "nobody", "--weight", "2"], 4, "no tenant named 'nobody'"),
    (["revoke", "taken", "0123"], 4, "tenant 'taken' has no active token '0123'"),
]


async def test_the_cli_refuses_bad_input_with_one_line_and_writes_nothing(
    cli: Cli, owner: asyncpg.Connection
) -> None:
    # One served control plane for every case: starting one takes a while.
    assert (await cli("create", "taken"))[0] == 0
    before = await event_count(owner)
    for args, code, message in CLI_REFUSALS:
        returned, out, err = await cli(*args)
        assert (returned, out) == (code, ""), (args, err)
        assert message in err, args
        assert len(err.splitlines()) == 1, err
    assert await event_count(owner) == before


async def test_a_tenants_token_cannot_manage_tenants(cli: Cli, tmp_path: Path) -> None:
    _, token, _ = await cli("create", "acme")
    token_file = tmp_path / "acme-token"
    token_file.write_text(token)
    code, out, err = await cli("list", "--token-file", str(token_file))
    assert (code, out) == (1, "")
    assert err == "trainyard: only the admin token may manage tenants\n"
