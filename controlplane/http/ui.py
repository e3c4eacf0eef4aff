"""The web dashboard, served by the control plane itself: its page and assets (inside the
package, no CDN: it works offline), and its sign-in: a bearer token traded for a session
(`controlplane.ui.application`), or the identity provider's flows
(`controlplane.identity.application`). The page holds no data; once signed in it reads the same
API a token does, with the session's cookie, so a tenant sees exactly what the API shows it.

The handlers route and authenticate, and set and clear the cookies (their flags are the
transport's: HttpOnly, SameSite, Secure over HTTPS); the facades decide."""

from __future__ import annotations

import functools
import hashlib
import html
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from importlib.resources import files
from typing import Annotated, Any, ClassVar, TypeVar
from urllib.parse import urlencode

import aiohttp
from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from controlplane.http import query
from controlplane.http.auth import IDENTITY, SESSION, principal
from controlplane.http.errors import error
from controlplane.http.keys import POOL
from controlplane.http.operations import Answer, Operation, Param, add_operations, answer
from controlplane.http.requests import json_body
from controlplane.identity.application import MAX_CODE, MAX_STATE, SignIn
from controlplane.identity.config import IdentityConfig
from controlplane.identity.loopback import (
    CHALLENGE_PATTERN,
    LOOPBACK_PATTERN,
    MAX_LOOPBACK,
    challenge_ok,
    loopback_uri,
)
from controlplane.identity.provider import OidcProvider
from controlplane.identity.service import LOGIN_TTL_S, Identity, Loopback, SignInRefused
from controlplane.identity.views import DeviceAuthorization, DevicePending, SsoSignOut, SsoToken
from controlplane.ui.application import Dashboard
from controlplane.ui.sessions import COOKIE, SESSION_TTL_S
from controlplane.ui.views import DashboardSession, SignInProviders, WhoAmI

DASHBOARD = web.AppKey("dashboard", Dashboard)

LOGIN_COOKIE = "trainyard_login"
"""Ties a provider's callback to the browser that started the sign-in. SameSite=Lax, not
Strict: the browser comes back from the provider's site, and a Strict cookie would stay home."""
START = "/ui/login/oidc"
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

M = TypeVar("M", bound="_Body")


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


@functools.cache
def _assets() -> dict[str, Asset]:
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


class _Body(BaseModel):
    """A sign-in request's JSON body. What it refuses, it refuses naming the first bad field
    (in the fields' order; the first when the body is no object) in the sign-in's own words,
    `refused`, not as a list of pydantic's."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    refused: ClassVar[str]
    """The 422's message; `{name}` is the field's name."""


def _token(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("token is required")
    return value


class TokenSignIn(_Body):
    refused = "token is required"

    # Taken as Python holds it, lone surrogates too (pydantic's str refuses them): a token
    # that is not text is an unknown token, a 401 as any other.
    token: Annotated[
        str, PlainValidator(_token), WithJsonSchema({"type": "string", "minLength": 1})
    ] = Field(description="a bearer token (ty_...)")


class LoopbackSignIn(_Body):
    refused = "{name} is required (a string of at most 200)"

    code: str = Field(
        min_length=1,
        max_length=200,
        description="the one-time code the browser brought to the CLI's loopback address",
    )
    verifier: str = Field(
        min_length=1,
        max_length=200,
        description="the PKCE verifier of the cli_challenge sent to /ui/login/oidc",
    )


class DeviceSignIn(_Body):
    refused = "device_code is required, as POST /v1/login/device gave it"

    device_code: str = Field(
        min_length=1, max_length=MAX_CODE, description="as POST /v1/login/device gave it"
    )


def _body(model: type[M], document: Any) -> M:
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        name = str(loc[0]) if loc else next(iter(model.model_fields))
        raise error(422, model.refused.format(name=name), field=name) from None


def _loopback(value: Any, name: str) -> str:
    try:
        return loopback_uri(value)
    except ValueError as exc:
        raise query.refuse(str(exc)) from None


class StartQuery(query.Query):
    cli: Annotated[
        str | None,
        query.Parameter(_loopback, {"maxLength": MAX_LOOPBACK, "pattern": LOOPBACK_PATTERN}),
    ] = Field(
        default=None,
        description="`trainyard login --sso`'s loopback address (http://127.0.0.1:PORT/PATH or "
        "http://[::1]:PORT/PATH): the browser is sent there with a one-time code (or the error) "
        "once signed in",
    )
    cli_challenge: str | None = Field(
        default=None,
        validate_default=True,
        description="with cli (required then): the CLI's PKCE S256 challenge",
        json_schema_extra={"pattern": CHALLENGE_PATTERN},
    )

    @field_validator("cli_challenge")
    @classmethod
    def _with_cli(cls, challenge: str | None, info: ValidationInfo) -> str | None:
        # Only a loopback sign-in takes a challenge; a cli refused above is said already.
        if info.data.get("cli") is not None and not challenge_ok(challenge or ""):
            raise query.refuse("cli_challenge must be a PKCE S256 challenge")
        return challenge

    def loopback(self) -> Loopback | None:
        if self.cli is None or self.cli_challenge is None:
            return None
        return Loopback(self.cli, self.cli_challenge)


class CallbackQuery(query.Query):
    """The provider's answer, as it sends it: whatever it holds, a refusal is a page (the
    facade checks it), not a JSON error."""

    code: str | None = Field(
        default=None,
        description="the authorization code",
        json_schema_extra={"maxLength": MAX_CODE},
    )
    state: str | None = Field(
        default=None,
        description="the sign-in's state, as sent to the provider",
        json_schema_extra={"maxLength": MAX_STATE},
    )
    error: str | None = Field(default=None, description="why the provider did not sign in")
    error_description: str | None = Field(default=None, description="the error, for a person")


async def home(_: web.Request) -> web.Response:
    raise web.HTTPFound("/ui/")


async def page(request: web.Request) -> web.Response:
    return _asset(request, "index.html")


async def static(request: web.Request) -> web.Response:
    return _asset(request, request.match_info["name"])


def _asset(request: web.Request, name: str) -> web.Response:
    found = _assets().get(name)
    if found is None:
        raise error(404, "no such file")
    headers = {**SECURITY_HEADERS, hdrs.ETAG: found.etag, hdrs.CACHE_CONTROL: "no-cache"}
    if request.headers.get(hdrs.IF_NONE_MATCH) == found.etag:
        return web.Response(status=304, headers=headers)
    response = web.Response(body=found.body, content_type=found.content_type, headers=headers)
    response.enable_compression()
    return response


def _json_refusals(handler: Handler) -> Handler:
    """The handler with a refused sign-in answered as an `Error` (also when the provider
    failed: a 502, which `controlplane.http.errors.error` does not send)."""

    @functools.wraps(handler)
    async def answering(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except SignInRefused as refused:
            body: dict[str, Any] = {"error": str(refused), "status": refused.status}
            if refused.field is not None:
                body["field"] = refused.field
            return web.json_response(body, status=refused.status)

    return answering


@_json_refusals
async def sign_in(request: web.Request) -> web.Response:
    """`{"token": "ty_..."}` (JSON only: a form another site posts is refused, so it cannot sign
    a browser in as someone else); 200 with the session's CSRF token and a cookie."""
    if request.content_type != "application/json":
        raise error(415, 'send the token as JSON: {"token": "ty_..."}')
    body = _body(TokenSignIn, await json_body(request))
    opened = await request.app[DASHBOARD].sign_in(body.token)
    response = answer(opened.view)
    _set_session(request, response, opened.cookie)
    return response


def _set_session(request: web.Request, response: web.StreamResponse, cookie: str) -> None:
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=int(SESSION_TTL_S),
        path="/",
        httponly=True,
        samesite="Strict",
        secure=_over_https(request),
    )


def _over_https(request: web.Request) -> bool:
    """Whether the browser reached us over HTTPS: directly, or through a proxy that ended TLS
    and says so. Trusting the header costs nothing: it can only make the cookie stricter."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.secure or forwarded == "https"


def _origin(request: web.Request) -> str:
    """The scheme and host the browser reached us at."""
    return f"{'https' if _over_https(request) else 'http'}://{request.host}"


async def whoami(request: web.Request) -> web.Response:
    """Who is signed in, and the session's CSRF token (null with a bearer token): the page
    reads it after a reload, as no script can read the cookie."""
    return answer(request.app[DASHBOARD].whoami(principal(request), request.get(SESSION)))


async def sign_out(request: web.Request) -> web.Response:
    """End the session (its cookie stops working at once, also copied elsewhere)."""
    principal(request)  # signed in: a sign-out changes something, with the CSRF token
    await request.app[DASHBOARD].sign_out(request.cookies.get(COOKIE))
    response = web.Response(status=204)
    response.del_cookie(COOKIE, path="/")
    return response


async def providers(request: web.Request) -> web.Response:
    return answer(request.app[DASHBOARD].providers())


async def oidc_start(request: web.Request) -> web.Response:
    """To the provider's sign-in page (authorization code flow with PKCE)."""
    flow = request.app[DASHBOARD].signing_in()
    asked = query.parsed(request, StartQuery)
    try:
        started = await flow.start_browser(_origin(request), asked.loopback())
    except SignInRefused as refused:
        return _browser_refusal(refused)
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
    flow = request.app[DASHBOARD].signing_in()
    asked = query.parsed(request, CallbackQuery)
    try:
        opened = await flow.finish_browser(
            _origin(request),
            request.cookies.get(LOGIN_COOKIE),
            code=asked.code,
            state=asked.state,
            error=asked.error,
            error_description=asked.error_description,
        )
    except SignInRefused as refused:
        return _browser_refusal(refused)
    if opened.loopback is not None:
        return _to_loopback(opened.loopback, {"code": opened.credential})
    response = web.Response(status=302, headers={hdrs.LOCATION: "/ui/"})
    response.del_cookie(LOGIN_COOKIE, path="/ui/login")
    _set_session(request, response, opened.credential)
    return response


def _browser_refusal(refused: SignInRefused) -> web.Response:
    """A refused sign-in told where the browser goes: to the waiting CLI (which shows why
    too), or a page saying why."""
    if refused.loopback is not None:
        return _to_loopback(refused.loopback, {"error": str(refused)})
    return _refusal(refused.status, str(refused))


def _to_loopback(uri: str, query: dict[str, str]) -> web.Response:
    response = web.Response(status=302, headers={hdrs.LOCATION: f"{uri}?{urlencode(query)}"})
    response.del_cookie(LOGIN_COOKIE, path="/ui/login")
    return response


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


@_json_refusals
async def loopback_token(request: web.Request) -> web.Response:
    """`trainyard login --sso` (loopback): the one-time code the browser brought to the CLI and
    the verifier of the CLI's challenge, for its bearer token."""
    flow = request.app[DASHBOARD].signing_in()
    body = _body(LoopbackSignIn, await json_body(request))
    return answer(await flow.finish_loopback(body.code, body.verifier))


@_json_refusals
async def device_start(request: web.Request) -> web.Response:
    """`trainyard login`'s device flow (RFC 8628): the code the person enters at the provider,
    and the device code the CLI polls with."""
    return answer(await request.app[DASHBOARD].signing_in().start_device())


@_json_refusals
async def device_token(request: web.Request) -> web.Response:
    """Poll: 202 while the person has not approved; 200 with the bearer token once they have."""
    flow = request.app[DASHBOARD].signing_in()
    body = _body(DeviceSignIn, await json_body(request))
    found = await flow.finish_device(body.device_code)
    return answer(found, status=202 if isinstance(found, DevicePending) else 200)


@_json_refusals
async def cli_sign_out(request: web.Request) -> web.Response:
    """`trainyard logout`: end the sign-in session whose bearer token the request carries (it
    passed authentication, so it is live), and revoke its refresh token at the provider."""
    flow = request.app[DASHBOARD].signing_in()
    bearer = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")[2].strip()
    return answer(await flow.end(bearer))


HTML: Mapping[str, Any] = {"type": "string"}
NOT_CONFIGURED = "no identity provider is configured"


def _page(description: str) -> Answer:
    """A page saying why a browser's sign-in failed."""
    return Answer(description, HTML, media="text/html")


def _dashboard(operation_id: str, path: str) -> Operation:
    return Operation(
        "get",
        path,
        page,
        operation_id,
        "The web dashboard's page (no data: it reads the API once signed in)",
        {
            200: Answer("the page", HTML, media="text/html"),
            304: Answer("unchanged since the ETag sent (If-None-Match)"),
        },
        public=True,
    )


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "get",
        "/",
        home,
        "home",
        "Redirects to the dashboard",
        {302: Answer("to /ui/")},
        public=True,
    ),
    _dashboard("dashboard", "/ui"),
    _dashboard("dashboardSlash", "/ui/"),
    Operation(
        "get",
        "/ui/static/{name}",
        static,
        "dashboardAsset",
        "One of the dashboard's scripts and styles (ETag, no-cache)",
        {
            200: Answer("the file"),
            304: Answer("unchanged since the ETag sent (If-None-Match)"),
        },
        {404: "no such file"},
        public=True,
        params=(Param("name", "path", "the file's name", {"type": "string"}),),
    ),
    Operation(
        "post",
        "/ui/session",
        sign_in,
        "signIn",
        "Sign in with a bearer token: an HttpOnly, SameSite=Strict session cookie (8 hours; "
        "Secure over HTTPS) and the session's CSRF token",
        {200: Answer("signed in", DashboardSession)},
        {
            400: "malformed JSON",
            401: "an invalid or revoked token",
            415: "not JSON",
            422: "no token",
        },
        public=True,
        body=TokenSignIn,
        body_required=True,
    ),
    Operation(
        "get",
        "/ui/session",
        whoami,
        "whoAmI",
        "Who is signed in, and the session's CSRF token",
        {200: Answer("the principal", WhoAmI)},
        {401: "not signed in"},
    ),
    Operation(
        "delete",
        "/ui/session",
        sign_out,
        "signOut",
        "Sign out: the session ends at once",
        {204: Answer("signed out")},
        {401: "not signed in", 403: "no X-CSRF-Token"},
    ),
    Operation(
        "get",
        "/ui/login",
        providers,
        "signInProviders",
        "The identity provider the sign-in page offers (null: tokens only)",
        {200: Answer("the provider's name and where its sign-in starts", SignInProviders)},
        public=True,
    ),
    Operation(
        "get",
        START,
        oidc_start,
        "signInWithProvider",
        "To the provider's sign-in page (authorization code flow with PKCE; a SameSite=Lax "
        "cookie ties the callback to this browser)",
        {302: Answer("to the provider"), 502: _page("the identity provider failed: a page")},
        {
            400: "a cli that is not a loopback address, or no challenge",
            404: NOT_CONFIGURED,
        },
        public=True,
        query=StartQuery,
    ),
    Operation(
        "get",
        CALLBACK,
        oidc_callback,
        "signInCallback",
        "Where the provider sends the browser back: the code is traded for tokens, the ID "
        "token verified, the groups mapped; a session cookie and the dashboard, or a page "
        "saying why not",
        {
            302: Answer(
                "signed in: to the dashboard, with a session cookie (or to the CLI's loopback "
                "address with its one-time code or the error)"
            ),
            400: _page("no code or state, or a sign-in of another browser or expired"),
            401: _page("the provider refused the sign-in, or its ID token is invalid"),
            403: _page("the person's groups map to no tenant nor to the admin"),
            502: _page("the identity provider failed"),
        },
        {404: NOT_CONFIGURED},
        public=True,
        query=CallbackQuery,
    ),
    Operation(
        "post",
        "/v1/login/loopback/token",
        loopback_token,
        "loopbackSignInToken",
        "`trainyard login --sso` without a device flow: the one-time code the browser brought "
        "to the CLI's loopback address, and the verifier of the challenge it sent to "
        "/ui/login/oidc, for a bearer token",
        {200: Answer("signed in", SsoToken)},
        {
            400: "malformed JSON",
            401: "a code unknown, used, expired or of another verifier",
            404: NOT_CONFIGURED,
            422: "no code or verifier",
        },
        public=True,
        body=LoopbackSignIn,
        body_required=True,
    ),
    Operation(
        "post",
        "/v1/login/device",
        device_start,
        "deviceSignIn",
        "`trainyard login`: start the provider's device flow (RFC 8628)",
        {
            200: Answer(
                "the code to enter at the provider, and the device code", DeviceAuthorization
            )
        },
        {
            404: NOT_CONFIGURED + ", or it offers no device flow",
            502: "the identity provider failed",
        },
        public=True,
    ),
    Operation(
        "post",
        "/v1/login/device/token",
        device_token,
        "deviceSignInToken",
        "Poll (at the interval given): 202 until the person approved, then a bearer token",
        {
            200: Answer("signed in", SsoToken),
            202: Answer("not yet approved (authorization_pending or slow_down)", DevicePending),
        },
        {
            400: "malformed JSON",
            401: "the provider refused (expired or denied device code)",
            403: "the person's groups map to no tenant nor to the admin",
            404: NOT_CONFIGURED,
            422: "no device_code",
            502: "the identity provider failed",
        },
        public=True,
        body=DeviceSignIn,
        body_required=True,
    ),
    Operation(
        "delete",
        "/v1/login/session",
        cli_sign_out,
        "endSignInSession",
        "`trainyard logout`: end the sign-in session of the bearer token sent (a `ty_sso_` "
        "token), and revoke its refresh token at the provider (RFC 7009) where the provider "
        "offers revocation",
        {200: Answer("ended; whether the provider revoked its token too", SsoSignOut)},
        {
            400: "a token not of a sign-in session (an issued token)",
            401: "missing, unknown or ended token",
            404: NOT_CONFIGURED,
        },
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
    app.cleanup_ctx.append(_identity)
    app.on_startup.append(_open)


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


async def _open(app: web.Application) -> None:
    # After the cleanup contexts (the pool's, the identity provider's) have started.
    identity = app.get(IDENTITY)
    flow = None if identity is None else SignIn(identity, start=START, callback=CALLBACK)
    app[DASHBOARD] = Dashboard(app[POOL], flow)
