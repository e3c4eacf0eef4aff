"""Sign-in through a real OpenID Connect provider (tests/oidc: the npm `oidc-provider`, started
here) against the control plane's app on a real Postgres: ID tokens are verified against the
provider's JWKS (issuer, audience, expiry, unknown keys refused; rotation honoured, refetches
rate-limited); the dashboard's authorization code flow with PKCE and the CLI's device flow open
sessions as the operator's group mapping says (a tenant, the admin, or refused with a reason);
and a session ends once the provider revokes or expires its token."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from controlplane.database import connect
from controlplane.http.app import create_app
from controlplane.identity.config import IdentityConfig
from controlplane.identity.provider import InvalidToken, OidcProvider, pkce_pair
from controlplane.ui.sessions import COOKIE
from harness.served import ServedControlPlane
from tests.oidc.running import (
    CLIENT_ID,
    Provider,
    approve,
    browser_session,
    new_key,
    require_provider,
)
from tests.tenancy import Tokens, auth

ACCOUNTS = {
    "alice": {"groups": ["ml-acme"]},
    "gina": {"groups": ["interns", "ml-globex"]},
    "root": {"groups": ["trainyard-admins"]},
    "mallory": {"groups": ["interns"]},
}
MAPPING = {
    "TRAINYARD_OIDC_TENANT_GROUPS": "ml-acme=acme, ml-globex=globex",
    "TRAINYARD_OIDC_ADMIN_GROUPS": "trainyard-admins",
    # Checked with the provider at every request a second after the last check.
    "TRAINYARD_OIDC_CHECK_INTERVAL_S": "1",
}


@pytest.fixture(scope="module", autouse=True)
def provider_present() -> None:
    require_provider()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """The app's socket, bound before the provider starts: a port only probed and let go could
    be the one the provider's own probe picks next, and the app's bind would then fail."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound


@pytest.fixture
def port(listener: socket.socket) -> int:
    return int(listener.getsockname()[1])


def app_server(db_url: str, listener: socket.socket) -> TestServer:
    """The control plane's app served on the test's bound socket."""
    port = int(listener.getsockname()[1])
    return TestServer(
        create_app(db_url, poll_interval=0.1), port=port, socket_factory=lambda *_: listener
    )


async def running(port: int, **ttl: int) -> Provider:
    return await Provider([f"http://127.0.0.1:{port}/ui/login/callback"], ACCOUNTS, ttl).start()


@pytest.fixture
async def provider(port: int) -> AsyncIterator[Provider]:
    started = await running(port)
    yield started
    await started.stop()


def configure(monkeypatch: pytest.MonkeyPatch, provider: Provider, tmp_path: Path) -> None:
    for name, value in provider.settings(tmp_path / "client-secret", **MAPPING).items():
        monkeypatch.setenv(name, value)


@pytest.fixture
async def server(
    db_url: str,
    tokens: Tokens,
    provider: Provider,
    listener: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> AsyncIterator[str]:
    """The control plane's app with the provider configured; its base URL."""
    configure(monkeypatch, provider, tmp_path)
    async with app_server(db_url, listener) as served:
        yield str(served.make_url("")).rstrip("/")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with browser_session() as session:
        yield session


async def device_login(http: aiohttp.ClientSession, server: str, login: str) -> dict[str, Any]:
    """`trainyard login`'s exchange: the device flow, the person approving at the provider."""
    async with http.post(f"{server}/v1/login/device") as answer:
        assert answer.status == 200, await answer.text()
        device = await answer.json()
    assert device["user_code"] and device["verification_uri"].startswith("http://127.0.0.1")
    async with http.post(
        f"{server}/v1/login/device/token", json={"device_code": device["device_code"]}
    ) as answer:
        assert answer.status == 202 and (await answer.json())["pending"] == "authorization_pending"
    async with browser_session() as person:  # each person at a browser of their own
        page = await approve(person, device["verification_uri_complete"], login)
    assert "Sign-in Success" in page, page
    async with http.post(
        f"{server}/v1/login/device/token", json={"device_code": device["device_code"]}
    ) as answer:
        body: dict[str, Any] = await answer.json()
        body["status"] = answer.status
        return body


async def whoami(http: aiohttp.ClientSession, server: str, token: str) -> tuple[int, Any]:
    async with http.get(f"{server}/ui/session", headers=auth(token)) as answer:
        return answer.status, await answer.json()


async def test_id_tokens_are_verified_against_the_published_keys(
    provider: Provider, tmp_path: Path
) -> None:
    config = IdentityConfig.from_env(provider.settings(tmp_path / "secret"))
    assert config is not None
    now = [0.0]
    async with aiohttp.ClientSession() as http:
        oidc = OidcProvider(config, http, refetch_s=60, clock=lambda: now[0])
        claims = await oidc.verify(provider.sign(groups=["ml-acme"]))
        assert claims["sub"] == "alice" and claims["groups"] == ["ml-acme"]
        assert oidc.jwks_fetches == 1
        now[0] += 61  # past the rate limit's window
        past = int(time.time()) - 3600
        refused = {  # each token, and what the refusal says
            provider.sign(iss="https://elsewhere.example"): "Invalid claim: 'iss'",
            provider.sign(aud="another-app"): "Invalid claim: 'aud'",
            provider.sign(exp=past, iat=past - 60): "The token is expired",
            provider.sign(exp=None): "Missing claim: 'exp'",
            provider.sign(nonce="not-the-one"): "Invalid claim: 'nonce'",
            provider.sign(key=new_key("stranger")): "'stranger', which the provider does not",
            "not.a.jwt": "not a signed JWT",
        }
        for token, why in refused.items():
            with pytest.raises(InvalidToken, match=re.escape(why)):
                await oidc.verify(token, nonce="the-one" if "nonce" in why else None)
        assert "does not publish" in str(
            await _refusal(oidc, provider.sign(key=new_key("stranger-2")))
        )
        # Unknown key ids refetched the JWKS once, then the rate limit held: two tokens with
        # made-up key ids cost the provider one request, not two.
        assert oidc.jwks_fetches == 2
        # Rotation: the provider now signs with a new key. Past the rate limit's window, the
        # first token with its key id fetches the JWKS again and is accepted; the old key is
        # no longer published, so its tokens are refused.
        await provider.rotate("second")
        now[0] += 61
        assert (await oidc.verify(provider.sign(sub="bob")))["sub"] == "bob"
        assert oidc.jwks_fetches == 3
        stale = provider.sign(key=new_key("first"))
        assert "does not publish" in str(await _refusal(oidc, stale))


async def _refusal(oidc: OidcProvider, token: str) -> InvalidToken:
    try:
        await oidc.verify(token)
    except InvalidToken as refused:
        return refused
    raise AssertionError("a token was accepted")


async def test_device_flow_maps_groups_to_a_tenant_or_the_admin_and_refuses_the_unmapped(
    server: str, http: aiohttp.ClientSession
) -> None:
    alice = await device_login(http, server, "alice")
    assert alice["status"] == 200, alice
    assert alice["token"].startswith("ty_sso_") and alice["tenant"] == "acme"
    assert await whoami(http, server, alice["token"]) == (
        200,
        {"tenant": "acme", "is_admin": False, "csrf": None, "expires_at": None},
    )
    async with http.get(f"{server}/v1/jobs", headers=auth(alice["token"])) as answer:
        assert answer.status == 200
    gina = await device_login(http, server, "gina")
    assert (gina["status"], gina["tenant"]) == (200, "globex")
    root = await device_login(http, server, "root")
    assert (root["status"], root["is_admin"], root["tenant"]) == (200, True, None)
    async with http.get(f"{server}/v1/tenants", headers=auth(root["token"])) as answer:
        assert answer.status == 200  # the admin's route
    mallory = await device_login(http, server, "mallory")
    assert mallory["status"] == 403, mallory
    assert "no group that Trainyard maps" in mallory["error"] and "interns" in mallory["error"]
    # A made-up token of the same shape is nobody.
    status, _ = await whoami(http, server, "ty_sso_" + "x" * 43)
    assert status == 401


async def test_dashboard_sign_in_is_the_code_flow_with_pkce(
    server: str, http: aiohttp.ClientSession, provider: Provider
) -> None:
    async with http.get(f"{server}/ui/login") as answer:
        assert await answer.json() == {"oidc": {"name": "Example SSO", "url": "/ui/login/oidc"}}
    async with http.get(f"{server}/ui/login/oidc", allow_redirects=False) as answer:
        assert answer.status == 302
        location = answer.headers["Location"]
        login_cookie = answer.cookies["trainyard_login"]
    assert location.startswith(provider.issuer + "/auth?")
    assert "code_challenge_method=S256" in location and "nonce=" in location
    assert login_cookie["samesite"] == "Lax" and login_cookie["httponly"]
    # The person signs in at the provider, which sends the browser back to the callback; the
    # callback's answer (a cookie, then the dashboard) is followed like a browser would.
    landing = await approve(http, location, "alice")
    assert "<title>Trainyard</title>" in landing
    cookies = {c.key: c for c in http.cookie_jar}
    session = cookies[COOKIE]
    assert session["samesite"] == "Strict" and session["httponly"]
    async with http.get(f"{server}/ui/session") as answer:
        me = await answer.json()
    assert me["tenant"] == "acme" and me["csrf"]
    # The cookie changes nothing without the CSRF token, as a token's session.
    manifest = {"name": "j", "image": "img", "command": ["true"]}
    async with http.post(f"{server}/v1/jobs", json=manifest) as answer:
        assert answer.status == 403
    async with http.post(
        f"{server}/v1/jobs", json=manifest, headers={"X-CSRF-Token": me["csrf"]}
    ) as answer:
        assert answer.status == 201, await answer.text()
    # A callback replayed, or brought to another browser, signs no one in.
    async with http.get(f"{server}/ui/login/oidc", allow_redirects=False) as answer:
        state = answer.headers["Location"].split("state=")[1].split("&")[0]
    callback = f"{server}/ui/login/callback?code=x&state={state}"
    async with browser_session() as other, other.get(callback) as answer:
        assert answer.status == 400
        assert "another browser" in await answer.text()
    async with http.get(f"{server}/ui/login/callback?error=access_denied") as answer:
        assert answer.status == 401 and "access_denied" in await answer.text()
    # Signing out ends the session.
    async with http.delete(f"{server}/ui/session", headers={"X-CSRF-Token": me["csrf"]}) as answer:
        assert answer.status == 204
    async with http.get(
        f"{server}/ui/session", headers={"Cookie": f"{COOKIE}={session.value}"}
    ) as answer:
        assert answer.status == 401


async def test_a_session_ends_when_the_provider_revokes_its_token(
    server: str, http: aiohttp.ClientSession, provider: Provider, db_url: str
) -> None:
    alice = await device_login(http, server, "alice")
    token = alice["token"]
    await asyncio.sleep(1.1)
    # Checked with the provider (its refresh token used, and rotated): still good.
    assert (await whoami(http, server, token))[0] == 200
    refresh = await _refresh_token(db_url)
    await provider.revoke(http, refresh)
    await asyncio.sleep(1.1)
    status, body = await whoami(http, server, token)
    assert status == 401, body
    reason = await _end_reason(db_url)
    assert "refused the session's refresh token" in reason


async def test_a_session_ends_when_the_providers_token_expires(
    db_url: str,
    tokens: Tokens,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    listener: socket.socket,
    port: int,
) -> None:
    provider = await running(port, RefreshToken=3, AccessToken=2)
    try:
        configure(monkeypatch, provider, tmp_path)
        async with app_server(db_url, listener) as served:
            server = str(served.make_url("")).rstrip("/")
            async with browser_session() as http:
                alice = await device_login(http, server, "alice")
                assert (await whoami(http, server, alice["token"]))[0] == 200
                await asyncio.sleep(3.5)
                status, body = await whoami(http, server, alice["token"])
                assert status == 401, body
        # The refresh token had expired at the provider, which said so.
        assert "refused the session's refresh token (invalid_grant" in await _end_reason(db_url)
    finally:
        await provider.stop()


async def _refresh_token(db_url: str) -> str:
    conn = await connect(db_url, role=None)
    try:
        return str(await conn.fetchval("SELECT refresh_token FROM identity_sessions"))
    finally:
        await conn.close()


async def _end_reason(db_url: str) -> str:
    conn = await connect(db_url, role=None)
    try:
        return str(await conn.fetchval("SELECT end_reason FROM identity_sessions"))
    finally:
        await conn.close()


async def _provider_refreshes(http: aiohttp.ClientSession, provider: Provider, token: str) -> int:
    """The status of the provider's answer to a refresh with `token` (200: still good)."""
    headers = {"Authorization": aiohttp.encode_basic_auth(CLIENT_ID, provider.client_secret)}
    form = {"grant_type": "refresh_token", "refresh_token": token}
    async with http.post(f"{provider.issuer}/token", data=form, headers=headers) as answer:
        return answer.status


async def test_signing_out_ends_the_session_and_revokes_its_token_at_the_provider(
    server: str, http: aiohttp.ClientSession, provider: Provider, db_url: str, tokens: Tokens
) -> None:
    alice = await device_login(http, server, "alice")
    refresh = await _refresh_token(db_url)
    sign_out = f"{server}/v1/login/session"
    # An issued token is not a sign-in session: an admin revokes it, not this.
    async with http.delete(sign_out, headers=auth(tokens.acme)) as answer:
        assert answer.status == 400 and (await answer.json())["field"] == "Authorization"
    async with http.delete(sign_out, headers=auth(alice["token"])) as answer:
        assert answer.status == 200, await answer.text()
        assert await answer.json() == {"revoked_at_provider": True}
    assert (await whoami(http, server, alice["token"]))[0] == 401
    assert await _end_reason(db_url) == "signed out"
    # Revoked where it was issued: a copy of the refresh token grants nothing more, and the
    # control plane keeps none.
    assert await _provider_refreshes(http, provider, refresh) == 400
    assert await _refresh_token(db_url) == "None"
    async with http.delete(sign_out, headers=auth(alice["token"])) as answer:
        assert answer.status == 401


async def test_trainyard_login_sso_saves_a_token_the_other_commands_use(
    server: str, tmp_path: Path
) -> None:
    """`trainyard login --sso` as a person types it: it shows where to approve, waits, saves
    the token; `trainyard list` then works with it, as with a token from the admin, until
    `trainyard logout` ends the session and forgets the token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env["TRAINYARD_HOME"] = str(tmp_path / "home")
    command = [sys.executable, "-m", "cli"]
    login = await asyncio.create_subprocess_exec(
        *command, "login", "--server", server, "--sso", env=env, stdout=PIPE, stderr=PIPE
    )
    assert login.stdout is not None
    first = (await asyncio.wait_for(login.stdout.readline(), 30)).decode()
    assert first.startswith("To sign in, open http://127.0.0.1"), first
    async with browser_session() as person:
        page = await approve(person, first.split("open ", 1)[1].strip(), "alice")
    assert "Sign-in Success" in page
    out, err = await asyncio.wait_for(login.communicate(), 60)
    printed = first + out.decode()
    assert login.returncode == 0, (printed, err.decode())
    assert "Waiting for you to approve..." in printed
    assert f"logged in to {server} as tenant acme until " in printed
    listing = await asyncio.create_subprocess_exec(
        *command, "list", env=env, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(listing.communicate(), 60)
    assert listing.returncode == 0, err.decode()
    saved = Path(env["TRAINYARD_HOME"]) / "client.json"
    token = json.loads(saved.read_text())["token"]
    logout = await asyncio.create_subprocess_exec(
        *command, "logout", env=env, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(logout.communicate(), 60)
    assert logout.returncode == 0, err.decode()
    assert f"ended the sign-in session at {server}; the identity provider revoked its token" in (
        out.decode()
    )
    assert json.loads(saved.read_text()) == {"server": server}
    async with browser_session() as http:
        assert (await whoami(http, server, token))[0] == 401
    listing = await asyncio.create_subprocess_exec(
        *command, "list", env=env, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(listing.communicate(), 60)
    assert listing.returncode == 2 and "no token" in err.decode(), err.decode()


async def test_hostile_or_broken_sign_in_requests_get_clear_errors(
    server: str, http: aiohttp.ClientSession, provider: Provider
) -> None:
    token = f"{server}/v1/login/device/token"
    for body, status, why in (
        ({}, 422, "device_code is required"),
        ({"device_code": 7}, 422, "device_code is required"),
        ({"device_code": "x" * 5000}, 422, "device_code is required"),
        ({"device_code": "made-up"}, 401, "the identity provider refused the sign-in"),
    ):
        async with http.post(token, json=body) as answer:
            got = await answer.json()
            assert (answer.status, got["status"]) == (status, status), got
            assert why in got["error"], got
    async with http.post(
        token, data=b"{not json", headers={"Content-Type": "application/json"}
    ) as answer:
        assert answer.status == 400
    callback = f"{server}/ui/login/callback"
    for query in ("", "?code=x", f"?code=x&state={'s' * 500}"):
        async with http.get(callback + query) as answer:
            assert answer.status == 400 and "text/html" in answer.headers["Content-Type"]
    # A provider that is down: the sign-in says so (502), and nothing else breaks.
    await provider.stop()
    async with http.post(f"{server}/v1/login/device/token", json={"device_code": "x"}) as answer:
        got = await answer.json()
        assert answer.status == 502 and "cannot be reached" in got["error"], got


async def test_without_a_provider_the_sign_in_routes_say_so(db_url: str, tokens: Tokens) -> None:
    async with (
        TestServer(create_app(db_url, poll_interval=0.1)) as served,
        browser_session() as http,
    ):
        base = str(served.make_url("")).rstrip("/")
        async with http.get(f"{base}/ui/login") as answer:
            assert await answer.json() == {"oidc": None}
        for method, path in (
            ("POST", "/v1/login/device"),
            ("POST", "/v1/login/device/token"),
            ("GET", "/ui/login/oidc"),
            ("GET", "/ui/login/callback"),
        ):
            async with http.request(method, base + path) as answer:
                got = await answer.json()
                assert answer.status == 404 and "no identity provider" in got["error"], got


@pytest.fixture
async def no_device_flow(
    db_url: str,
    tokens: Tokens,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    listener: socket.socket,
    port: int,
) -> AsyncIterator[str]:
    """The app with a provider that offers no device flow; its base URL."""
    callback = f"http://127.0.0.1:{port}/ui/login/callback"
    provider = await Provider([callback], ACCOUNTS, device_flow=False).start()
    try:
        configure(monkeypatch, provider, tmp_path)
        async with app_server(db_url, listener) as served:
            yield str(served.make_url("")).rstrip("/")
    finally:
        await provider.stop()


async def test_the_loopback_code_goes_only_to_the_cli_holding_the_verifier(
    no_device_flow: str,
) -> None:
    server = no_device_flow
    got: list[dict[str, str]] = []

    async def cli(request: web.Request) -> web.Response:
        got.append(dict(request.query))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/callback", cli)
    async with TestServer(app, host="127.0.0.1") as loopback, browser_session() as http:
        async with http.post(f"{server}/v1/login/device") as answer:
            assert answer.status == 404 and "no device flow" in (await answer.json())["error"]
        verifier, challenge = pkce_pair()
        start = f"{server}/ui/login/oidc?" + urlencode(
            {"cli": str(loopback.make_url("/callback")), "cli_challenge": challenge}
        )
        page = await approve(http, start, "alice")
        assert page == "ok", page[-1500:]
        code = got[0]["code"]
        exchange = f"{server}/v1/login/loopback/token"
        async with http.post(exchange, json={"code": code, "verifier": "x" * 64}) as answer:
            assert answer.status == 401  # another's verifier
        async with http.post(exchange, json={"code": code, "verifier": verifier}) as answer:
            body = await answer.json()
            assert answer.status == 200 and body["tenant"] == "acme", body
        assert (await whoami(http, server, body["token"]))[0] == 200
        async with http.post(exchange, json={"code": code, "verifier": verifier}) as answer:
            assert answer.status == 401  # once only
        # The unmapped person: the waiting CLI is told why.
        async with browser_session() as mallory:
            await approve(mallory, start, "mallory")
        assert "no group that Trainyard maps" in got[-1]["error"]
        for cli_uri in (
            "http://evil.example:80/cb",
            "https://127.0.0.1:9/cb",
            "http://127.0.0.1/cb",
        ):
            query = urlencode({"cli": cli_uri, "cli_challenge": challenge})
            async with http.get(f"{server}/ui/login/oidc?{query}", allow_redirects=False) as answer:
                assert answer.status == 400 and (await answer.json())["field"] == "cli"


async def test_trainyard_login_sso_falls_back_to_the_loopback_redirect(
    no_device_flow: str, tmp_path: Path
) -> None:
    server = no_device_flow
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env["TRAINYARD_HOME"] = str(tmp_path / "home")
    login = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "cli", "login", "--server", server, "--sso"),
        env=env,
        stdout=PIPE,
        stderr=PIPE,
    )
    assert login.stdout is not None
    first = (await asyncio.wait_for(login.stdout.readline(), 30)).decode()
    assert first.startswith(f"To sign in, open {server}/ui/login/oidc?cli="), first
    async with browser_session() as person:
        page = await approve(person, first.split("open ", 1)[1].strip(), "gina")
    assert "you may close this tab" in page
    out, err = await asyncio.wait_for(login.communicate(), 60)
    printed = first + out.decode()
    assert login.returncode == 0, (printed, err.decode())
    assert "Waiting for you to sign in..." in printed
    assert f"logged in to {server} as tenant globex until " in printed


async def test_a_session_ends_when_the_persons_groups_no_longer_map(
    server: str, http: aiohttp.ClientSession, provider: Provider, db_url: str
) -> None:
    alice = await device_login(http, server, "alice")
    # Moved from ml-acme to ml-globex at the provider: the next check maps her to globex.
    provider.set_groups("alice", ["ml-globex"])
    await asyncio.sleep(1.1)
    assert (await whoami(http, server, alice["token"]))[1]["tenant"] == "globex"
    # Removed from every mapped group: the next check ends the session, saying why.
    provider.set_groups("alice", ["interns"])
    await asyncio.sleep(1.1)
    assert (await whoami(http, server, alice["token"]))[0] == 401
    assert "is in no group that Trainyard maps" in await _end_reason(db_url)


async def test_a_wrong_setting_stops_the_control_planes_start(db_url: str, tmp_path: Path) -> None:
    served = ServedControlPlane(db_url, tmp_path, env={"TRAINYARD_OIDC_ISSUER": "sso.example"})
    with pytest.raises(RuntimeError, match="exited with 1"):  # one line naming the setting
        await served.start()
