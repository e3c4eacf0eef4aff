"""Tenants and bearer tokens: tokens authenticate their holder, are stored only hashed, stop
working when revoked; bad input writes nothing; the admin token is bootstrapped once; the
projection rebuilds identically; the middleware answers 401; the CLI prints a token once."""

from __future__ import annotations

import asyncio
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.http.auth import PRINCIPALS, auth_middleware, principal
from controlplane.http.keys import POOL
from controlplane.projections.runner import ProjectionRunner
from controlplane.queries import Q
from controlplane.settings import ADMIN_TOKEN_FILE as TOKEN_FILE
from controlplane.tenants.admin import bootstrap_admin_token
from controlplane.tenants.errors import InvalidTenant, TenantExists, UnknownTenant, UnknownToken
from controlplane.tenants.principals import (
    IDLE_S,
    REFRESH_S,
    TRUSTED_S,
    Principal,
    Principals,
)
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import (
    create_tenant,
    issue_token,
    list_tenants,
    revoke_token,
    update_tenant,
)
from controlplane.tenants.tokens import PREFIX, token_sha256
from tests.tenancy import event_count

ACTOR = "test"
ACME = Principal(tenant="acme", is_admin=False)
ADMIN = Principal(tenant=None, is_admin=True)

Client = TestClient[web.Request, web.Application]
LOOKUPS = Principals()
"""One process's lookups across these tests, trusting what it found live: a revocation must
reach through that (tokens are random, so the tests' entries never meet)."""
authenticate = LOOKUPS.authenticate


@pytest.fixture
def runner(pool: asyncpg.Pool, store: EventStore, db_url: str) -> ProjectionRunner:
    return ProjectionRunner(pool, store, LogListener(db_url), [TenantsProjection()])


async def everything_stored(owner: asyncpg.Connection) -> str:
    """Every row of every table, as text."""
    tables = await owner.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    dumps: list[str] = []
    for table in tables:
        rows = await owner.fetch(f'SELECT t::text AS row FROM "{table["tablename"]}" t')
        dumps.extend(r["row"] for r in rows)
    return "\n".join(dumps)


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_principal_sees_its_own_tenant_and_the_admin_sees_all() -> None:
    assert ACME.may_see("acme")
    assert not ACME.may_see("globex")
    assert ADMIN.may_see("acme") and ADMIN.may_see("globex")
    with pytest.raises(ValueError):
        Principal(tenant="acme", is_admin=True)
    with pytest.raises(ValueError):
        Principal(tenant=None, is_admin=False)


async def test_a_new_tenants_token_authenticates_as_that_tenant(
    pool: asyncpg.Pool, store: EventStore, runner: ProjectionRunner
) -> None:
    acme = await create_tenant(store, runner, "acme", 2.5, 8, actor=ACTOR)
    globex = await create_tenant(store, runner, "globex", actor=ACTOR)
    assert acme.plaintext.startswith(PREFIX)
    assert acme.plaintext not in repr(acme)
    assert await authenticate(pool, acme.plaintext) == ACME
    assert await authenticate(pool, globex.plaintext) == Principal(tenant="globex", is_admin=False)
    listed = await list_tenants(pool)
    assert [(t.name, t.weight, t.gpu_quota, t.active_tokens) for t in listed] == [
        ("acme", 2.5, 8, (acme.token_id,)),
        ("globex", 1.0, None, (globex.token_id,)),
    ]


async def test_wrong_and_revoked_tokens_authenticate_no_one(
    pool: asyncpg.Pool, store: EventStore, runner: ProjectionRunner
) -> None:
    first = await create_tenant(store, runner, "acme", actor=ACTOR)
    assert await authenticate(pool, first.plaintext + "x") is None
    assert await authenticate(pool, first.plaintext.removeprefix(PREFIX)) is None
    assert await authenticate(pool, "") is None
    second = await issue_token(store, runner, "acme", actor=ACTOR)
    assert await authenticate(pool, first.plaintext) == ACME
    assert await authenticate(pool, second.plaintext) == ACME
    await revoke_token(store, runner, "acme", first.token_id, actor=ACTOR)
    assert await authenticate(pool, first.plaintext) is None
    assert await authenticate(pool, second.plaintext) == ACME
    third = await issue_token(store, runner, "acme", revoke_others=True, actor=ACTOR)
    assert await authenticate(pool, second.plaintext) is None
    assert await authenticate(pool, third.plaintext) == ACME
    assert [t.active_tokens for t in await list_tenants(pool)] == [(third.token_id,)]


async def test_a_live_token_is_trusted_for_a_moment_then_looked_up_again(
    pool: asyncpg.Pool, store: EventStore, runner: ProjectionRunner, owner: asyncpg.Connection
) -> None:
    """What another control plane's revocation looks like to this one until its wait ends:
    trusted for TRUSTED_S after the lookup, then refused."""
    acme = await create_tenant(store, runner, "acme", actor=ACTOR)
    now = [100.0]
    principals = Principals(clock=lambda: now[0])
    assert await principals.authenticate(pool, acme.plaintext) == ACME
    await owner.execute(
        "UPDATE api_tokens SET revoked_at = now() WHERE token_id = $1", acme.token_id
    )
    now[0] += TRUSTED_S / 2
    assert await principals.authenticate(pool, acme.plaintext) == ACME  # trusted still
    now[0] += TRUSTED_S / 2
    assert await principals.authenticate(pool, acme.plaintext) is None
    # A token that authenticated no one is never kept: it is looked up each time.
    assert await principals.authenticate(pool, acme.plaintext) is None


class CountedLookups:
    """The pool, counting the single-token lookups (a request's path) made through it."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.lookups = 0

    async def execute(self, query: str, *args: Any) -> str:
        return await self.pool.execute(query, *args)

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        return await self.pool.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        self.lookups += 1
        return await self.pool.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self.pool.fetchval(query, *args)


async def test_a_token_in_use_is_read_again_in_the_background_and_its_revocation_seen(
    pool: asyncpg.Pool, store: EventStore, runner: ProjectionRunner, owner: asyncpg.Connection
) -> None:
    """Read again each REFRESH_S, a known token never sends a request to Postgres; a revocation
    is seen by the next reading, and a token unused for IDLE_S is no longer read."""
    acme = await create_tenant(store, runner, "acme", actor=ACTOR)
    globex = await create_tenant(store, runner, "globex", actor=ACTOR)
    now = [100.0]
    principals = Principals(clock=lambda: now[0])
    db = CountedLookups(pool)
    assert await principals.authenticate(db, acme.plaintext) == ACME
    assert await principals.authenticate(db, globex.plaintext) is not None
    assert db.lookups == 2
    for _ in range(8):  # four TRUSTED_S in all: past it, each time, without the readings
        now[0] += REFRESH_S
        await principals.refresh(db)
        assert await principals.authenticate(db, acme.plaintext) == ACME
    assert db.lookups == 2  # globex's token too was read again, though unused meanwhile
    await owner.execute(
        "UPDATE api_tokens SET revoked_at = now() WHERE token_id = $1", acme.token_id
    )
    now[0] += 0.01  # long before its trust from the last reading ran out
    await principals.refresh(db)
    assert await principals.authenticate(db, acme.plaintext) is None
    assert db.lookups == 3  # forgotten, so looked up: revoked
    now[0] += IDLE_S + REFRESH_S  # globex's token has not been shown since its lookup
    await principals.refresh(db)
    assert await principals.authenticate(db, globex.plaintext) is not None
    assert db.lookups == 4  # forgotten unread, so looked up again


async def test_a_revoked_token_is_refused_within_trusted_s_of_its_commit(
    pool: asyncpg.Pool, store: EventStore, runner: ProjectionRunner, owner: asyncpg.Connection
) -> None:
    """With the readings running on the real clock (as in `trainyard serve`), a token
    authenticating again and again is refused at most TRUSTED_S after its revocation commits
    (another control plane's revocation, seen from this one), and at once after `revoke_token`
    returns."""
    acme = await create_tenant(store, runner, "acme", actor=ACTOR)
    second = await issue_token(store, runner, "acme", actor=ACTOR)
    principals = Principals()
    async with asyncio.TaskGroup() as group:
        group.create_task(principals.run(pool))
        try:
            assert await principals.authenticate(pool, acme.plaintext) == ACME
            await asyncio.sleep(TRUSTED_S)  # trusted now from a reading, not the lookup
            await owner.execute(
                "UPDATE api_tokens SET revoked_at = now() WHERE token_id = $1", acme.token_id
            )
            committed = time.monotonic()
            # Used again and again until TRUSTED_S has passed since the commit (those requests
            # are refused once a reading has seen the revocation, as likely as not): a request
            # from then on is refused, whatever the readings did meanwhile.
            while time.monotonic() - committed < TRUSTED_S:
                await principals.authenticate(pool, acme.plaintext)
                await asyncio.sleep(0.005)
            assert await principals.authenticate(pool, acme.plaintext) is None
            assert await principals.authenticate(pool, second.plaintext) == ACME
            await revoke_token(store, runner, "acme", second.token_id, actor=ACTOR)
            assert await principals.authenticate(pool, second.plaintext) is None
        finally:
            principals.stop()


async def test_tokens_are_stored_only_hashed(
    store: EventStore, runner: ProjectionRunner, owner: asyncpg.Connection, tmp_path: Path
) -> None:
    tokens = [
        (await create_tenant(store, runner, "acme", actor=ACTOR)).plaintext,
        (await issue_token(store, runner, "acme", actor=ACTOR)).plaintext,
    ]
    admin = await bootstrap_admin_token(store, runner, tmp_path)
    assert admin is not None
    stored = await everything_stored(owner)
    for token in [*tokens, admin]:
        # Its hash is there (in the events and in `api_tokens`), so the dump covers both.
        assert stored.count(token_sha256(token)) == 2
        assert token.removeprefix(PREFIX) not in stored


async def test_a_duplicate_tenant_is_a_clear_error_and_writes_nothing(
    pool: asyncpg.Pool, store: EventStore, runner: ProjectionRunner, owner: asyncpg.Connection
) -> None:
    original = await create_tenant(store, runner, "acme", actor=ACTOR)
    before = await event_count(owner)
    with pytest.raises(TenantExists, match="tenant 'acme' already exists; nothing was written"):
        await create_tenant(store, runner, "acme", 3, 1, actor=ACTOR)
    assert await event_count(owner) == before
    assert [(t.weight, t.active_tokens) for t in await list_tenants(pool)] == [
        (1.0, (original.token_id,))
    ]


@pytest.mark.parametrize(
    ("name", "weight", "quota", "message"),
    [
        ("Acme", 1.0, None, "invalid tenant name 'Acme'"),
        ("9lives", 1.0, None, "invalid tenant name"),
        ("a" * 64, 1.0, None, "invalid tenant name"),
        ("acme\n", 1.0, None, "invalid tenant name"),
        ("acme", 0.0, None, "invalid weight 0.0: it must be a positive number"),
        ("acme", -1.0, None, "invalid weight"),
        ("acme", float("nan"), None, "invalid weight"),
        ("acme", float("inf"), None, "invalid weight"),
        ("acme", 1.0, -1, "invalid GPU quota -1"),
    ],
)
async def test_invalid_tenants_are_refused_and_write_nothing(
    store: EventStore,
    runner: ProjectionRunner,
    owner: asyncpg.Connection,
    name: str,
    weight: float,
    quota: int | None,
    message: str,
) -> None:
    with pytest.raises(InvalidTenant, match=message):
        await create_tenant(store, runner, name, weight, quota, actor=ACTOR)
    assert await event_count(owner) == 0


async def test_unknown_tenants_and_tokens_are_clear_errors(
    store: EventStore, runner: ProjectionRunner, owner: asyncpg.Connection
) -> None:
    with pytest.raises(UnknownTenant, match="no tenant named 'nobody'"):
        await issue_token(store, runner, "nobody", actor=ACTOR)
    token = await create_tenant(store, runner, "acme", actor=ACTOR)
    await create_tenant(store, runner, "globex", actor=ACTOR)
    before = await event_count(owner)
    with pytest.raises(UnknownToken, match="tenant 'globex' has no active token"):
        await revoke_token(store, runner, "globex", token.token_id, actor=ACTOR)
    await revoke_token(store, runner, "acme", token.token_id, actor=ACTOR)
    with pytest.raises(UnknownToken):  # revoked already
        await revoke_token(store, runner, "acme", token.token_id, actor=ACTOR)
    assert await event_count(owner) == before + 1


async def test_a_tenants_weight_and_quota_change_alone_or_together(
    pool: asyncpg.Pool, store: EventStore, runner: ProjectionRunner, owner: asyncpg.Connection
) -> None:
    await create_tenant(store, runner, "acme", 2, 4, actor=ACTOR)

    async def settings() -> list[tuple[float, int | None]]:
        return [(t.weight, t.gpu_quota) for t in await list_tenants(pool, "acme")]

    await update_tenant(store, runner, "acme", weight=0.5, actor=ACTOR)
    assert await settings() == [(0.5, 4)]
    await update_tenant(store, runner, "acme", gpu_quota=None, actor=ACTOR)
    assert await settings() == [(0.5, None)]
    await update_tenant(store, runner, "acme", weight=3, gpu_quota=0, actor=ACTOR)
    assert await settings() == [(3, 0)]
    before = await event_count(owner)
    with pytest.raises(InvalidTenant, match="invalid weight"):
        await update_tenant(store, runner, "acme", weight=-1, actor=ACTOR)
    with pytest.raises(InvalidTenant, match="invalid GPU quota"):
        await update_tenant(store, runner, "acme", gpu_quota=-1, actor=ACTOR)
    with pytest.raises(UnknownTenant):
        await update_tenant(store, runner, "nobody", weight=1, actor=ACTOR)
    assert await event_count(owner) == before
    assert await list_tenants(pool, "nobody") == []


async def test_concurrent_rotations_each_land(
    pool: asyncpg.Pool, store: EventStore, runner: ProjectionRunner
) -> None:
    await create_tenant(store, runner, "acme", actor=ACTOR)
    issued = await asyncio.gather(
        *(issue_token(store, runner, "acme", actor=ACTOR) for _ in range(5))
    )
    for token in issued:
        assert await authenticate(pool, token.plaintext) == ACME
    [acme] = await list_tenants(pool)
    assert len(acme.active_tokens) == 6


async def test_a_command_waits_for_a_runner_that_holds_the_projection(
    pool: asyncpg.Pool, store: EventStore, runner: ProjectionRunner, owner: asyncpg.Connection
) -> None:
    async with owner.transaction():  # as a serving replica does while it applies a batch
        assert await owner.fetchval(Q["lock_projections"], ["tenants"])
        creating = asyncio.create_task(create_tenant(store, runner, "acme", actor=ACTOR))
        await asyncio.sleep(0.3)
        assert not creating.done()
    token = await asyncio.wait_for(creating, 5)
    assert await authenticate(pool, token.plaintext) == ACME


async def test_the_admin_token_is_bootstrapped_once_into_a_private_file(
    pool: asyncpg.Pool, store: EventStore, runner: ProjectionRunner, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    token = await bootstrap_admin_token(store, runner, home)
    assert token is not None and token.startswith(PREFIX)
    assert await authenticate(pool, token) == ADMIN
    path = home / TOKEN_FILE
    assert path.read_text() == token + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert await bootstrap_admin_token(store, runner, home) is None
    assert await bootstrap_admin_token(store, runner, tmp_path / "elsewhere") is None
    assert path.read_text() == token + "\n"
    assert files_in(home) == [TOKEN_FILE]
    assert not (tmp_path / "elsewhere").exists()


async def test_replicas_starting_together_bootstrap_one_admin_token(
    pool: asyncpg.Pool, store: EventStore, runner: ProjectionRunner, tmp_path: Path
) -> None:
    results = await asyncio.gather(
        *(bootstrap_admin_token(store, runner, tmp_path) for _ in range(4))
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert (tmp_path / TOKEN_FILE).read_text() == winners[0] + "\n"
    assert files_in(tmp_path) == [TOKEN_FILE]
    assert await authenticate(pool, winners[0]) == ADMIN


async def test_rebuild_equals_the_incremental_build(
    store: EventStore, runner: ProjectionRunner, owner: asyncpg.Connection, tmp_path: Path
) -> None:
    acme = await create_tenant(store, runner, "acme", 2, 4, actor=ACTOR)
    await create_tenant(store, runner, "globex", 0.5, actor=ACTOR)
    await issue_token(store, runner, "globex", revoke_others=True, actor=ACTOR)
    await issue_token(store, runner, "acme", actor=ACTOR)
    await revoke_token(store, runner, "acme", acme.token_id, actor=ACTOR)
    await update_tenant(store, runner, "globex", weight=3, actor=ACTOR)
    await update_tenant(store, runner, "acme", gpu_quota=None, actor=ACTOR)
    await bootstrap_admin_token(store, runner, tmp_path)

    async def snapshot() -> list[list[dict[str, Any]]]:
        return [
            [dict(r) for r in await owner.fetch("SELECT * FROM tenants ORDER BY name")],
            [dict(r) for r in await owner.fetch("SELECT * FROM api_tokens ORDER BY token_id")],
        ]

    incremental = await snapshot()
    assert len(incremental[0]) == 2 and len(incremental[1]) == 5
    assert [(r["weight"], r["gpu_quota"]) for r in incremental[0]] == [(2, None), (3, None)]
    assert await runner.rebuild("tenants") == 11
    assert await snapshot() == incremental


@pytest.fixture
async def client(pool: asyncpg.Pool) -> AsyncIterator[Client]:
    """A tiny app behind the middleware: public probes, and a route that echoes its caller."""

    async def whoami(request: web.Request) -> web.Response:
        who = principal(request)
        return web.json_response({"tenant": who.tenant, "is_admin": who.is_admin})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application(middlewares=[auth_middleware])
    app[POOL] = pool
    app[PRINCIPALS] = Principals()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/v1/whoami", whoami)
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_the_middleware_lets_through_only_live_tokens(
    client: Client, store: EventStore, runner: ProjectionRunner, tmp_path: Path
) -> None:
    acme = await create_tenant(store, runner, "acme", actor=ACTOR)
    admin = await bootstrap_admin_token(store, runner, tmp_path)
    assert admin is not None

    assert (await client.get("/healthz")).status == 200  # no token needed

    async def whoami(headers: dict[str, str]) -> tuple[int, dict[str, Any], str | None]:
        response = await client.get("/v1/whoami", headers=headers)
        return response.status, await response.json(), response.headers.get("WWW-Authenticate")

    assert await whoami({"Authorization": f"Bearer {acme.plaintext}"}) == (
        200,
        {"tenant": "acme", "is_admin": False},
        None,
    )
    assert await whoami({"Authorization": f"bearer {admin}"}) == (
        200,
        {"tenant": None, "is_admin": True},
        None,
    )
    missing = await whoami({})
    assert missing[0] == 401
    assert missing[1] == {
        "error": "missing bearer token: send 'Authorization: Bearer <token>'",
        "status": 401,
    }
    assert missing[2] == 'Bearer realm="trainyard"'
    for malformed in (acme.plaintext, f"Basic {acme.plaintext}", "Bearer "):
        status, body, _ = await whoami({"Authorization": malformed})
        assert (status, body["error"]) == (
            401,
            "malformed Authorization header: expected 'Bearer <token>'",
        )
    wrong = await whoami({"Authorization": f"Bearer {acme.plaintext}x"})
    assert wrong == (
        401,
        {"error": "invalid or revoked token", "status": 401},
        'Bearer realm="trainyard", error="invalid_token"',
    )
    # Unknown paths too: no route's existence is disclosed without a token.
    assert (await client.get("/v1/nope")).status == 401
    await revoke_token(store, runner, "acme", acme.token_id, actor=ACTOR)
    revoked = await whoami({"Authorization": f"Bearer {acme.plaintext}"})
    assert revoked[0] == 401
