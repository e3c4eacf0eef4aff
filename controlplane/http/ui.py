"""The web dashboard, served by the control plane itself: its page and assets (inside the
package, no CDN: it works offline), and its sessions (`controlplane.ui.sessions`). The page
holds no data; once signed in it reads the same API a token does, with the session's cookie,
so a tenant sees exactly what the API shows it."""

from __future__ import annotations

import hashlib
import html
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib.resources import files
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import hdrs, web

from controlplane.http.auth import IDENTITY, PRINCIPAL, SESSION, principal
from controlplane.http.errors import error
from controlplane.http.keys import POOL
from controlplane.http.requests import json_body
from controlplane.identity.config import IdentityConfig
from controlplane.identity.loopback import challenge_ok, loopback_uri
from controlplane.identity.provider import OidcProvider
from controlplane.identity.service import (
    CLI_PREFIX,
    LOGIN_TTL_S,
    Ended,
    Identity,
    Loopback,
    Opened,
    SignInRefused,
)
from controlplane.ui.sessions import COOKIE, SESSION_TTL_S, end_session, open_session

LOGIN_COOKIE = "trainyard_login"
"""Ties a provider's callback to the browser that started the sign-in. SameSite=Lax, not
Strict: the browser comes back from the provider's site, and a Strict cookie would stay home."""
CALLBACK = "/ui/login/callback"

ASSETS = files("controlplane.ui") / "static"
TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    # Only the page's own scripts, styles and API: an injected tag runs nothing, fetches nothing.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def _load() -> dict[str, Asset]:
    """Every asset, read once: the package's files, by name (no path from a request is ever
    opened)."""
    assets = {}
    for entry in ASSETS.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in TYPES:
            body = entry.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
            assets[entry.name] = Asset(body, TYPES[suffix], etag)
    return assets


def add_routes(app: web.Application) -> None:
    assets = _load()

    async def asset(request: web.Request, name: str) -> web.Response:
        found = assets.get(name)
        if found is None:
            raise error(404, "no such file")
        headers = {**SECURITY_HEADERS, hdrs.ETAG: found.etag, hdrs.CACHE_CONTROL: "no-cache"}
        if request.headers.get(hdrs.IF_NONE_MATCH) == found.etag:
            return web.Response(status=304, headers=headers)
        response = web.Response(body=found.body, content_type=found.content_type, headers=headers)
        response.enable_compression()
        return response

    async def page(request: web.Request) -> web.Response:
        return await asset(request, "index.html")

    async def static(request: web.Request) -> web.Response:
        return await asset(request, request.match_info["name"])

    app.router.add_get("/", home)
    app.router.add_get("/ui", page)
    app.router.add_get("/ui/", page)
    app.router.add_get("/ui/static/{name}", static)
    app.router.add_post("/ui/session", sign_in)
    app.router.add_get("/ui/session", whoami)
    app.router.add_delete("/ui/session", sign_out)
    app.router.add_get("/ui/login", providers)
    app.router.add_get("/ui/login/oidc", oidc_start)
    app.router.add_get(CALLBACK, oidc_callback)
    app.router.add_post("/v1/login/device", device_start)
    app.router.add_post("/v1/login/device/token", device_token)
    app.router.add_post("/v1/login/loopback/token", loopback_token)
    app.router.add_delete("/v1/login/session", cli_sign_out)
    app.cleanup_ctx.append(_identity)


async def _identity(app: web.Application) -> AsyncIterator[None]:
    """The identity provider's sign-in, when the environment configures one (a wrong setting
    stops the start, naming it)."""
    config = IdentityConfig.from_env()
    if config is None:
        yield
        return
    async with aiohttp.ClientSession() as http:
        app[IDENTITY] = Identity(config, OidcProvider(config, http), app[POOL])
        yield


async def home(_: web.Request) -> web.Response:
    raise web.HTTPFound("/ui/")


async def sign_in(request: web.Request) -> web.Response:
    """`{"token": "ty_..."}` (JSON only: a form another site posts is refused, so it cannot sign
    a browser in as someone else); 200 with the session's CSRF token and a cookie."""
    if request.content_type != "application/json":
        raise error(415, 'send the token as JSON: {"token": "ty_..."}')
    body = await json_body(request)
    token = body.get("token") if isinstance(body, dict) else None
    if not isinstance(token, str) or not token:
        raise error(422, "token is required", field="token")
    opened = await open_session(request.app[POOL], token)
    if opened is None:
        raise error(401, "invalid or revoked token", field="token")
    response = web.json_response({"csrf": opened.csrf, "expires_at": opened.expires_at.isoformat()})
    response.set_cookie(
        COOKIE,
        opened.cookie,
        max_age=int(SESSION_TTL_S),
        path="/",
        httponly=True,
        samesite="Strict",
        secure=_over_https(request),
    )
    return response


def _over_https(request: web.Request) -> bool:
    """Whether the browser reached us over HTTPS: directly, or through a proxy that ended TLS
    and says so. Trusting the header costs nothing: it can only make the cookie stricter."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.secure or forwarded == "https"


async def whoami(request: web.Request) -> web.Response:
    """Who is signed in, and the session's CSRF token (null with a bearer token): the page
    reads it after a reload, as no script can read the cookie."""
    who = principal(request)
    found = request.get(SESSION)
    return web.json_response(
        {
            "tenant": who.tenant,
            "is_admin": who.is_admin,
            "csrf": None if found is None else found.csrf,
            "expires_at": None if found is None else found.expires_at.isoformat(),
        }
    )


async def sign_out(request: web.Request) -> web.Response:
    """End the session (its cookie stops working at once, also copied elsewhere)."""
    if PRINCIPAL in request and COOKIE in request.cookies:
        await end_session(request.app[POOL], request.cookies[COOKIE])
        if IDENTITY in request.app:
            await request.app[IDENTITY].end(request.cookies[COOKIE], "signed out")
    response = web.Response(status=204)
    response.del_cookie(COOKIE, path="/")
    return response


async def providers(request: web.Request) -> web.Response:
    """The identity provider the sign-in page offers, if any."""
    found = request.app.get(IDENTITY)
    return web.json_response(
        {"oidc": None if found is None else {"name": found.config.name, "url": "/ui/login/oidc"}}
    )


def _identity_of(request: web.Request) -> Identity:
    found = request.app.get(IDENTITY)
    if found is None:
        raise error(404, "no identity provider is configured: sign in with a token")
    return found


def _redirect_uri(request: web.Request, identity: Identity) -> str:
    base = (
        identity.config.public_url
        or f"{'https' if _over_https(request) else 'http'}://{request.host}"
    )
    return base + CALLBACK


async def oidc_start(request: web.Request) -> web.Response:
    """To the provider's sign-in page (authorization code flow with PKCE)."""
    identity = _identity_of(request)
    cli = None
    if "cli" in request.query:
        # `trainyard login --sso` without a device flow: it waits on a loopback address.
        challenge = request.query.get("cli_challenge", "")
        try:
            uri = loopback_uri(request.query["cli"])
        except ValueError as exc:
            raise error(400, str(exc), field="cli") from exc
        if not challenge_ok(challenge):
            raise error(400, "cli_challenge must be a PKCE S256 challenge", field="cli_challenge")
        cli = Loopback(uri, challenge)
    try:
        started = await identity.start_browser(_redirect_uri(request, identity), cli)
    except SignInRefused as refused:
        return _refusal(refused.status, str(refused))
    response = web.Response(status=302, headers={hdrs.LOCATION: started.url})
    response.set_cookie(
        LOGIN_COOKIE,
        started.binding,
        max_age=int(LOGIN_TTL_S),
        path="/ui/login",
        httponly=True,
        samesite="Lax",
        secure=_over_https(request),
    )
    return response


async def oidc_callback(request: web.Request) -> web.Response:
    """The provider sends the browser back here: the code is traded for tokens (with the
    PKCE verifier), the ID token verified and the person's groups mapped; a session cookie as
    with a token, or a page saying why not."""
    identity = _identity_of(request)
    query = request.query
    if "error" in query:
        why = query.get("error_description") or query["error"]
        return _refusal(401, f"the identity provider did not sign you in: {why}")
    code, state = query.get("code"), query.get("state")
    binding = request.cookies.get(LOGIN_COOKIE)
    if not code or not state:
        return _refusal(400, "the identity provider's answer lacks its code or state")
    if not binding or len(binding) > 100 or len(state) > 100 or len(code) > 2000:
        return _refusal(
            400, "this sign-in was started in another browser or has expired: sign in again"
        )
    try:
        opened = await identity.finish_browser(
            binding, state, code, _redirect_uri(request, identity)
        )
    except SignInRefused as refused:
        if refused.loopback is not None:  # the waiting CLI shows why, too
            return _to_loopback(refused.loopback, {"error": str(refused)})
        return _refusal(refused.status, str(refused))
    if opened.loopback is not None:
        return _to_loopback(opened.loopback, {"code": opened.credential})
    response = web.Response(status=302, headers={hdrs.LOCATION: "/ui/"})
    response.del_cookie(LOGIN_COOKIE, path="/ui/login")
    response.set_cookie(
        COOKIE,
        opened.credential,
        max_age=int(SESSION_TTL_S),
        path="/",
        httponly=True,
        samesite="Strict",
        secure=_over_https(request),
    )
    return response


def _to_loopback(uri: str, query: dict[str, str]) -> web.Response:
    response = web.Response(status=302, headers={hdrs.LOCATION: f"{uri}?{urlencode(query)}"})
    response.del_cookie(LOGIN_COOKIE, path="/ui/login")
    return response


async def loopback_token(request: web.Request) -> web.Response:
    """`trainyard login --sso` (loopback): the one-time code the browser brought to the CLI and
    the verifier of the CLI's challenge, for its bearer token."""
    identity = _identity_of(request)
    body = await json_body(request)
    fields = {}
    for name in ("code", "verifier"):
        value = body.get(name) if isinstance(body, dict) else None
        if not isinstance(value, str) or not value or len(value) > 200:
            raise error(422, f"{name} is required (a string of at most 200)", field=name)
        fields[name] = value
    opened = await identity.finish_loopback(fields["code"], fields["verifier"])
    if opened is None:
        raise error(
            401, "this code is unknown, used, expired or not yours: sign in again", field="code"
        )
    return _signed_in(opened)


def _signed_in(opened: Opened) -> web.Response:
    return web.json_response(
        {
            "token": opened.credential,
            "tenant": opened.principal.tenant,
            "is_admin": opened.principal.is_admin,
            "expires_at": opened.expires_at.isoformat(),
        }
    )


def _refusal(status: int, message: str) -> web.Response:
    """A page (the browser is on its way back from the provider, not in the dashboard's script)
    saying why the sign-in failed, with the way back."""
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Sign-in failed · '
        'Trainyard</title><link rel="stylesheet" href="/ui/static/app.css"></head><body>'
        '<main id="main"><div class="sign-in card" data-test="sign-in-refused">'
        "<h1>Sign-in failed</h1>"
        '<p class="error-text" role="alert" data-test="sign-in-refused-why">'
        f"{html.escape(message)}</p>"
        '<p><a href="/ui/" data-test="sign-in-again">Back to the sign-in page</a></p>'
        "</div></main></body></html>"
    )
    response = web.Response(
        status=status, text=body, content_type="text/html", headers=SECURITY_HEADERS
    )
    response.del_cookie(LOGIN_COOKIE, path="/ui/login")
    return response


async def device_start(request: web.Request) -> web.Response:
    """`trainyard login`'s device flow (RFC 8628): the code the person enters at the provider,
    and the device code the CLI polls with."""
    identity = _identity_of(request)
    try:
        answer = await identity.start_device()
    except SignInRefused as refused:
        return _failure(refused)
    keys = ("device_code", "user_code", "verification_uri", "verification_uri_complete")
    shown: dict[str, Any] = {key: answer.get(key) for key in keys}
    shown["interval"] = answer.get("interval", 5)
    shown["expires_in"] = answer.get("expires_in")
    return web.json_response(shown)


async def device_token(request: web.Request) -> web.Response:
    """Poll: 202 while the person has not approved; 200 with the bearer token once they have."""
    identity = _identity_of(request)
    body = await json_body(request)
    code = body.get("device_code") if isinstance(body, dict) else None
    if not isinstance(code, str) or not code or len(code) > 2000:
        raise error(
            422, "device_code is required, as POST /v1/login/device gave it", field="device_code"
        )
    try:
        opened = await identity.finish_device(code)
    except SignInRefused as refused:
        return _failure(refused, "device_code")
    if isinstance(opened, str):
        return web.json_response({"pending": opened}, status=202)
    return _signed_in(opened)


async def cli_sign_out(request: web.Request) -> web.Response:
    """`trainyard logout`: end the sign-in session whose bearer token the request carries (it
    passed authentication, so it is live), and revoke its refresh token at the provider."""
    identity = _identity_of(request)
    token = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")[2].strip()
    if not token.startswith(CLI_PREFIX):
        raise error(
            400,
            "only a session of `trainyard login --sso` is ended here; an admin revokes an "
            "issued token",
            field="Authorization",
        )
    ended = await identity.end(token, "signed out")
    return web.json_response({"revoked_at_provider": ended is Ended.REVOKED})


def _failure(refused: SignInRefused, field: str | None = None) -> web.Response:
    """The JSON error for a refused sign-in (502 when the provider failed, which
    `controlplane.http.errors.error` does not send)."""
    body: dict[str, Any] = {"error": str(refused), "status": refused.status}
    if field is not None and refused.status < 500:
        body["field"] = field
    return web.json_response(body, status=refused.status)


def openapi_paths() -> dict[str, object]:
    html = {"text/html": {"schema": {"type": "string"}}}
    session = {
        "type": "object",
        "properties": {
            "tenant": {"type": ["string", "null"]},
            "is_admin": {"type": "boolean"},
            "csrf": {
                "type": ["string", "null"],
                "description": "send it as X-CSRF-Token with every request that changes "
                "something (null when authenticated by a bearer token)",
            },
            "expires_at": {"type": ["string", "null"], "format": "date-time"},
        },
    }
    failure = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    return {
        "/": {
            "get": {
                "operationId": "home",
                "summary": "Redirects to the dashboard",
                "responses": {"302": {"description": "to /ui/"}},
            }
        },
        **{
            path: {
                "get": {
                    "operationId": operation,
                    "summary": "The web dashboard's page (no data: it reads the API once "
                    "signed in)",
                    "responses": {"200": {"description": "the page", "content": html}},
                }
            }
            for path, operation in (("/ui", "dashboard"), ("/ui/", "dashboardSlash"))
        },
        "/ui/static/{name}": {
            "get": {
                "operationId": "dashboardAsset",
                "summary": "One of the dashboard's scripts and styles (ETag, no-cache)",
                "parameters": [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {"description": "the file"},
                    "304": {"description": "unchanged since the ETag sent"},
                    "404": {"description": "no such file", "content": failure},
                },
            }
        },
        **_sign_in_paths(html, failure),
        "/ui/session": {
            "post": {
                "operationId": "signIn",
                "summary": "Sign in with a bearer token: an HttpOnly, SameSite=Strict session "
                "cookie (8 hours; Secure over HTTPS) and the session's CSRF token",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["token"],
                                "properties": {"token": {"type": "string", "minLength": 1}},
                            }
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "signed in",
                        "content": {"application/json": {"schema": session}},
                    },
                    **{
                        str(status): {"description": why, "content": failure}
                        for status, why in (
                            (400, "malformed JSON"),
                            (401, "an invalid or revoked token"),
                            (415, "not JSON"),
                            (422, "no token"),
                        )
                    },
                },
            },
            "get": {
                "operationId": "whoAmI",
                "summary": "Who is signed in, and the session's CSRF token",
                "security": [{"bearer": []}],
                "responses": {
                    "200": {
                        "description": "the principal",
                        "content": {"application/json": {"schema": session}},
                    },
                    "401": {"description": "not signed in", "content": failure},
                },
            },
            "delete": {
                "operationId": "signOut",
                "summary": "Sign out: the session ends at once",
                "security": [{"bearer": []}],
                "responses": {
                    "204": {"description": "signed out"},
                    "401": {"description": "not signed in", "content": failure},
                    "403": {"description": "no X-CSRF-Token", "content": failure},
                },
            },
        },
    }


def _sign_in_paths(html: dict[str, Any], failure: dict[str, Any]) -> dict[str, object]:
    """The sign-in through the identity provider (docs/sign-in.md); 404 on every one of them
    when the operator configured none."""
    none = {"description": "no identity provider is configured", "content": failure}
    page = {"text/html": html["text/html"]}
    refused = {"description": "the sign-in failed: a page saying why", "content": page}
    tokens = {
        "type": "object",
        "required": ["token", "tenant", "is_admin", "expires_at"],
        "properties": {
            "token": {
                "type": "string",
                "description": "a bearer token (ty_sso_...) good while the provider vouches "
                "for the person",
            },
            "tenant": {"type": ["string", "null"]},
            "is_admin": {"type": "boolean"},
            "expires_at": {"type": "string", "format": "date-time"},
        },
    }
    device = {
        "type": "object",
        "properties": {
            "device_code": {"type": "string"},
            "user_code": {"type": "string"},
            "verification_uri": {"type": "string"},
            "verification_uri_complete": {"type": ["string", "null"]},
            "interval": {"type": "integer"},
            "expires_in": {"type": ["integer", "null"]},
        },
    }
    provider_failed = {"description": "the identity provider failed", "content": failure}
    return {
        "/ui/login": {
            "get": {
                "operationId": "signInProviders",
                "summary": "The identity provider the sign-in page offers (null: tokens only)",
                "responses": {
                    "200": {
                        "description": "the provider's name and where its sign-in starts",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["oidc"],
                                    "properties": {
                                        "oidc": {
                                            "type": ["object", "null"],
                                            "properties": {
                                                "name": {"type": "string"},
                                                "url": {"type": "string"},
                                            },
                                        }
                                    },
                                }
                            }
                        },
                    }
                },
            }
        },
        "/ui/login/oidc": {
            "get": {
                "operationId": "signInWithProvider",
                "summary": "To the provider's sign-in page (authorization code flow with PKCE; "
                "a SameSite=Lax cookie ties the callback to this browser)",
                "parameters": [
                    {
                        "name": "cli",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "`trainyard login --sso`'s loopback address "
                        "(http://127.0.0.1:PORT/PATH): the browser is sent there with a "
                        "one-time code (or the error) once signed in",
                    },
                    {
                        "name": "cli_challenge",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "with cli: the CLI's PKCE S256 challenge",
                    },
                ],
                "responses": {
                    "302": {"description": "to the provider"},
                    "400": {
                        "description": "a cli that is not a loopback address, or no challenge",
                        "content": failure,
                    },
                    "404": none,
                    "502": refused,
                },
            }
        },
        CALLBACK: {
            "get": {
                "operationId": "signInCallback",
                "summary": "Where the provider sends the browser back: the code is traded for "
                "tokens, the ID token verified, the groups mapped; a session cookie and the "
                "dashboard, or a page saying why not",
                "parameters": [
                    {"name": name, "in": "query", "schema": {"type": "string"}}
                    for name in ("code", "state", "error", "error_description")
                ],
                "responses": {
                    "302": {
                        "description": "signed in: to the dashboard, with a session cookie (or "
                        "to the CLI's loopback address with its one-time code or the error)"
                    },
                    **{
                        str(status): {**refused, "description": why}
                        for status, why in (
                            (400, "no code or state, or a sign-in of another browser or expired"),
                            (401, "the provider refused the sign-in, or its ID token is invalid"),
                            (403, "the person's groups map to no tenant nor to the admin"),
                            (502, "the identity provider failed"),
                        )
                    },
                    "404": none,
                },
            }
        },
        "/v1/login/loopback/token": {
            "post": {
                "operationId": "loopbackSignInToken",
                "summary": "`trainyard login --sso` without a device flow: the one-time code "
                "the browser brought to the CLI's loopback address, and the verifier of the "
                "challenge it sent to /ui/login/oidc, for a bearer token",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["code", "verifier"],
                                "properties": {
                                    "code": {"type": "string"},
                                    "verifier": {"type": "string"},
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "signed in",
                        "content": {"application/json": {"schema": tokens}},
                    },
                    **{
                        str(status): {"description": why, "content": failure}
                        for status, why in (
                            (400, "malformed JSON"),
                            (401, "a code unknown, used, expired or of another verifier"),
                            (404, "no identity provider is configured"),
                            (422, "no code or verifier"),
                        )
                    },
                },
            }
        },
        "/v1/login/device": {
            "post": {
                "operationId": "deviceSignIn",
                "summary": "`trainyard login`: start the provider's device flow (RFC 8628)",
                "responses": {
                    "200": {
                        "description": "the code to enter at the provider, and the device code",
                        "content": {"application/json": {"schema": device}},
                    },
                    "404": none,
                    "502": provider_failed,
                },
            }
        },
        "/v1/login/session": {
            "delete": {
                "operationId": "endSignInSession",
                "summary": "`trainyard logout`: end the sign-in session of the bearer token "
                "sent (a `ty_sso_` token), and revoke its refresh token at the provider (RFC "
                "7009) where the provider offers revocation",
                "security": [{"bearer": []}],
                "responses": {
                    "200": {
                        "description": "ended; whether the provider revoked its token too "
                        "(false: it offers no revocation or could not be reached, and its "
                        "token lapses at its expiry)",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["revoked_at_provider"],
                                    "properties": {"revoked_at_provider": {"type": "boolean"}},
                                }
                            }
                        },
                    },
                    **{
                        str(status): {"description": why, "content": failure}
                        for status, why in (
                            (400, "a token not of a sign-in session (an issued token)"),
                            (401, "missing, unknown or ended token"),
                            (404, "no identity provider is configured"),
                        )
                    },
                },
            }
        },
        "/v1/login/device/token": {
            "post": {
                "operationId": "deviceSignInToken",
                "summary": "Poll (at the interval given): 202 until the person approved, then "
                "a bearer token",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["device_code"],
                                "properties": {"device_code": {"type": "string"}},
                            }
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "signed in",
                        "content": {"application/json": {"schema": tokens}},
                    },
                    "202": {
                        "description": "not yet approved (authorization_pending or slow_down)",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {"pending": {"type": "string"}},
                                }
                            }
                        },
                    },
                    **{
                        str(status): {"description": why, "content": failure}
                        for status, why in (
                            (400, "malformed JSON"),
                            (401, "the provider refused (expired or denied device code)"),
                            (403, "the person's groups map to no tenant nor to the admin"),
                            (404, "no identity provider is configured"),
                            (422, "no device_code"),
                            (502, "the identity provider failed"),
                        )
                    },
                },
            }
        },
    }
