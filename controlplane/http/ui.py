"""The web dashboard, served by the control plane itself: its page and assets (inside the
package, no CDN: it works offline), and its sessions (`controlplane.ui.sessions`). The page
holds no data; once signed in it reads the same API a token does, with the session's cookie,
so a tenant sees exactly what the API shows it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files

from aiohttp import hdrs, web

from controlplane.http.auth import PRINCIPAL, SESSION, principal
from controlplane.http.errors import error
from controlplane.http.keys import POOL
from controlplane.http.requests import json_body
from controlplane.ui.sessions import COOKIE, SESSION_TTL_S, end_session, open_session

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
    response = web.Response(status=204)
    response.del_cookie(COOKIE, path="/")
    return response


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
                                "properties": {"token": {"type": "string"}},
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
