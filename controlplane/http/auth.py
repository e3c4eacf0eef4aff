"""Authentication of HTTP requests: the middleware that finds the request's principal (see
`controlplane.tenants.principals`), and what the handlers ask of it.

Every path but the public probes, documents, the dashboard's page and the sign-in needs
`Authorization: Bearer <token>`, or the dashboard's session cookie (`controlplane.ui.sessions`):
then a request that changes something must carry the session's CSRF token too (403 otherwise).
A sign-in through the identity provider (`controlplane.identity`, docs/sign-in.md) gives the
same: a cookie with a CSRF token, or a bearer token (`ty_sso_...`) for `trainyard login --sso`.
"""

from __future__ import annotations

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from controlplane.http.errors import error
from controlplane.http.keys import POOL
from controlplane.identity.service import CLI_PREFIX, Identity
from controlplane.invariants import InvariantBroken
from controlplane.tenants.principals import Principal, Principals
from controlplane.ui.sessions import COOKIE, CSRF_HEADER, Session, csrf_ok, session

SIGN_IN_PATHS = frozenset(
    {
        "/ui/login",
        "/ui/login/oidc",
        "/ui/login/callback",
        "/v1/login/device",
        "/v1/login/device/token",
        "/v1/login/loopback/token",
    }
)
"""The sign-in through the identity provider (docs/sign-in.md): it proves who someone is."""
PUBLIC_PATHS = (
    frozenset({"/healthz", "/readyz", "/openapi.json", "/", "/ui", "/ui/"}) | SIGN_IN_PATHS
)
"""Probes and documents that load balancers and clients read without a token, the dashboard's
page (which holds no data: it asks the API once signed in), and the sign-in."""
STATIC = "/ui/static/"
SIGN_IN = "/ui/session"

IDENTITY = web.AppKey("identity", Identity)
PRINCIPALS = web.AppKey("principals", Principals)
"""The identity provider's sign-in, when the operator configured one."""
PRINCIPAL = web.RequestKey("principal", Principal)
SESSION = web.RequestKey("session", Session)
"""The dashboard session a request's cookie opened (absent for a bearer token)."""


def acting_tenant(who: Principal, requested: str | None, action: str) -> str:
    """The tenant a request acts for: a tenant acts as itself; an admin names the tenant with
    `?tenant=` (`requested`). `action` completes the error messages ("submits", ...)."""
    if who.is_admin:
        if not requested:
            raise error(
                400, f"an admin {action} on behalf of a tenant: add ?tenant=NAME", field="tenant"
            )
        return requested
    if who.tenant is None:  # Principal: not the admin means exactly one tenant
        raise InvariantBroken("a principal neither the admin nor a tenant's")
    if requested not in (None, who.tenant):
        raise error(403, f"a tenant's token {action} only as {who.tenant!r}", field="tenant")
    return who.tenant


def principal(request: web.Request) -> Principal:
    """The authenticated principal of a request that passed `auth_middleware`."""
    return request[PRINCIPAL]


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate every request but the public ones; 401 with `WWW-Authenticate` otherwise."""
    path = request.path
    if path in PUBLIC_PATHS or path.startswith(STATIC):
        return await handler(request)
    if path == SIGN_IN and request.method == "POST":
        return await handler(request)  # the sign-in itself: it checks the token it is given
    header = request.headers.get(hdrs.AUTHORIZATION)
    if header is None and COOKIE in request.cookies:
        return await _with_session(request, handler, request.cookies[COOKIE])
    if header is None:
        return _unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return _unauthorized("malformed Authorization header: expected 'Bearer <token>'")
    who = await request.app[PRINCIPALS].authenticate(request.app[POOL], token)
    if who is None and token.startswith(CLI_PREFIX) and IDENTITY in request.app:
        # A session `trainyard login` opened through the identity provider.
        live = await request.app[IDENTITY].session(token, "cli")
        who = None if live is None else live.principal
    if who is None:
        return _unauthorized("invalid or revoked token", error="invalid_token")
    request[PRINCIPAL] = who
    return await handler(request)


async def _with_session(request: web.Request, handler: Handler, cookie: str) -> web.StreamResponse:
    found = await session(request.app[POOL], cookie)
    if found is None and IDENTITY in request.app:
        live = await request.app[IDENTITY].session(cookie, "browser")
        if live is not None and live.csrf is not None:
            found = Session(live.principal, live.csrf, live.expires_at)
    if found is None:
        return _unauthorized("the session has expired or ended: sign in again")
    if not csrf_ok(request.method, request.headers.get(CSRF_HEADER), found.csrf):
        return web.json_response(
            {
                "error": f"a request that changes something needs the session's {CSRF_HEADER}",
                "status": 403,
                "field": CSRF_HEADER,
            },
            status=403,
        )
    request[PRINCIPAL] = found.principal
    request[SESSION] = found
    return await handler(request)


def _unauthorized(message: str, *, error: str | None = None) -> web.Response:
    # RFC 6750: the challenge names the scheme, and the error when a token was presented.
    challenge = 'Bearer realm="trainyard"' + (f', error="{error}"' if error else "")
    return web.json_response(
        {"error": message, "status": 401},
        status=401,
        headers={hdrs.WWW_AUTHENTICATE: challenge},
    )
