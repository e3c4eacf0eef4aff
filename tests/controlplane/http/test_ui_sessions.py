"""The dashboard's sessions over HTTP on a real Postgres: a bearer token traded for an
HttpOnly, SameSite=Strict cookie; the cookie reads the API as the token would, and changes
nothing without the session's CSRF token; sign-out, a revoked token and expiry end it; the
page and its assets are served with a strict CSP, and nothing else of the package is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from http.cookies import SimpleCookie

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.http.app import create_app
from controlplane.ui.sessions import COOKIE
from tests.tenancy import Tokens

Client = TestClient[object, object]


@pytest.fixture
async def client(db_url: str, tokens: Tokens) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(db_url, poll_interval=0.1))) as client:
        yield client


async def signed_in(client: Client, token: str) -> tuple[str, str]:
    """The session's cookie value and CSRF token."""
    response = await client.post("/ui/session", json={"token": token})
    assert response.status == 200, await response.text()
    csrf = (await response.json())["csrf"]
    cookie = SimpleCookie(response.headers["Set-Cookie"])[COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
    return cookie.value, csrf


def with_cookie(value: str, csrf: str | None = None) -> dict[str, str]:
    headers = {"Cookie": f"{COOKIE}={value}"}
    if csrf is not None:
        headers["X-CSRF-Token"] = csrf
    return headers


async def test_a_session_reads_what_its_token_reads_and_changes_nothing_without_csrf(
    client: Client, tokens: Tokens
) -> None:
    client.session.cookie_jar.clear()
    cookie, csrf = await signed_in(client, tokens.acme)
    client.session.cookie_jar.clear()  # sent by hand below, to choose when
    whoami = await client.get("/ui/session", headers=with_cookie(cookie))
    assert await whoami.json() == {
        "tenant": "acme",
        "is_admin": False,
        "csrf": csrf,
        "expires_at": (await whoami.json())["expires_at"],
    }
    manifest = {"name": "j", "image": "img", "command": ["true"]}
    refused = await client.post("/v1/jobs", json=manifest, headers=with_cookie(cookie))
    assert refused.status == 403
    assert (await refused.json())["field"] == "X-CSRF-Token"
    wrong = await client.post("/v1/jobs", json=manifest, headers=with_cookie(cookie, "x" * 43))
    assert wrong.status == 403
    listed = await client.get("/v1/jobs", headers=with_cookie(cookie))
    assert (await listed.json())["total"] == 0  # nothing was submitted
    # No answer is sniffed into something else (a tenant's log text run as a page).
    assert listed.headers["X-Content-Type-Options"] == "nosniff"
    made = await client.post("/v1/jobs", json=manifest, headers=with_cookie(cookie, csrf))
    assert made.status == 201, await made.text()
    job_id = (await made.json())["id"]
    # The other tenant's session sees none of it, as its token would not.
    other, _ = await signed_in(client, tokens.globex)
    client.session.cookie_jar.clear()
    hidden = await client.get(f"/v1/jobs/{job_id}", headers=with_cookie(other))
    assert hidden.status == 404


async def test_sign_out_revocation_and_expiry_end_a_session(
    client: Client, tokens: Tokens, db_url: str
) -> None:
    cookie, csrf = await signed_in(client, tokens.acme)
    client.session.cookie_jar.clear()
    assert (await client.get("/v1/jobs", headers=with_cookie(cookie))).status == 200
    refused = await client.delete("/ui/session", headers=with_cookie(cookie))
    assert refused.status == 403  # signing out changes something: CSRF too
    out = await client.delete("/ui/session", headers=with_cookie(cookie, csrf))
    assert out.status == 204
    assert (await client.get("/v1/jobs", headers=with_cookie(cookie))).status == 401

    cookie, _ = await signed_in(client, tokens.acme)
    client.session.cookie_jar.clear()
    owner = await asyncpg.connect(db_url)
    try:
        await owner.execute("UPDATE ui_sessions SET expires_at = now() - interval '1 second'")
        assert (await client.get("/v1/jobs", headers=with_cookie(cookie))).status == 401
        cookie, _ = await signed_in(client, tokens.acme)
        client.session.cookie_jar.clear()
        await owner.execute("UPDATE api_tokens SET revoked_at = now() WHERE tenant = 'acme'")
        assert (await client.get("/v1/jobs", headers=with_cookie(cookie))).status == 401
        # A revoked token opens no session.
        again = await client.post("/ui/session", json={"token": tokens.acme})
        assert again.status == 401
        # Sessions store no cookie: only its hash.
        stored = await owner.fetchval("SELECT session_sha256 FROM ui_sessions LIMIT 1")
        assert stored != cookie and len(stored) == 64
    finally:
        await owner.close()


async def test_sign_in_takes_json_only_and_refuses_bad_tokens(client: Client) -> None:
    form = await client.post("/ui/session", data={"token": "ty_x"})
    assert form.status == 415  # another site's form cannot sign a browser in
    for body in ({}, {"token": 3}, {"token": ""}):
        assert (await client.post("/ui/session", json=body)).status == 422
    assert (await client.post("/ui/session", json={"token": "ty_nope"})).status == 401
    assert (await client.post("/ui/session", json={"token": "\udcff"})).status in (400, 401)
    nobody = await client.get("/ui/session", headers={"Cookie": f"{COOKIE}=forged"})
    assert nobody.status == 401


async def test_the_page_and_its_assets_are_served_with_a_strict_policy(client: Client) -> None:
    home = await client.get("/", allow_redirects=False)
    assert home.status == 302 and home.headers["Location"] == "/ui/"
    page = await client.get("/ui/")
    assert page.status == 200 and page.content_type == "text/html"
    policy = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert page.headers["X-Frame-Options"] == "DENY"
    again = await client.get("/ui/", headers={"If-None-Match": page.headers["ETag"]})
    assert again.status == 304
    for name in ("../sessions.py", "..%2Fsessions.py", "queries.sql", "nope.js"):
        response = await client.get(f"/ui/static/{name}")
        # Not found, or (a path that climbs out of static/) not a public path at all.
        assert response.status in (401, 404), name
        assert "import" not in await response.text()


async def test_the_cookie_is_secure_when_the_browser_came_over_https(
    client: Client, tokens: Tokens
) -> None:
    plain = await client.post("/ui/session", json={"token": tokens.acme})
    assert not SimpleCookie(plain.headers["Set-Cookie"])[COOKIE]["secure"]
    # Behind a proxy that ended TLS and says so.
    headers = {"X-Forwarded-Proto": "https"}
    proxied = await client.post("/ui/session", json={"token": tokens.acme}, headers=headers)
    assert SimpleCookie(proxied.headers["Set-Cookie"])[COOKIE]["secure"]
