"""Sign-in through the provider and the sessions it opens: the dashboard's (authorization code
with PKCE, a cookie) and the CLI's (device code, a bearer token `trainyard login` saves).

A session lasts while the provider vouches for the person: every `check_interval_s` (and once
the provider's token has expired) the next request that presents it uses the session's refresh
token at the provider, under a row lock. The provider refusing it (revoked, expired, the grant
withdrawn) ends the session; so does a new ID token whose groups no longer map. A provider that
cannot be reached leaves the session until the provider's last token expires."""

from __future__ import annotations

import enum
import hashlib
import logging
import secrets
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from controlplane.database import Executor
from controlplane.identity.config import IdentityConfig
from controlplane.identity.loopback import s256
from controlplane.identity.mapping import Unmapped, groups_of, principal_for
from controlplane.identity.provider import (
    InvalidToken,
    OidcProvider,
    ProviderError,
    Refused,
    Tokens,
    pkce_pair,
)
from controlplane.queries import Q
from controlplane.tenants.principals import Principal

log = logging.getLogger(__name__)
T = TypeVar("T")

CLI_PREFIX = "ty_sso_"
"""The bearer token `trainyard login` saves after a sign-in through the provider: recognisable
(to secret scanners too) as Trainyard's, and as a session's rather than an issued token's."""
BROWSER_TTL_S = 8 * 3600.0
"""As a token's dashboard session: a working day."""
CLI_TTL_S = 7 * 24 * 3600.0
"""A week at most, whatever the provider says; it ends sooner when the provider stops vouching."""
LOGIN_TTL_S = 600.0
"""How long a person may take at the provider's pages."""
HANDOFF_TTL_S = 120.0
"""How long a loopback sign-in's one-time code waits for its CLI (the query says so too)."""


class Ended(enum.Enum):
    """What a sign-out ended."""

    NOTHING = "no live session"
    ENDED = "the session ended"
    REVOKED = "the session ended and its token was revoked at the identity provider"


class SignInRefused(Exception):
    """A sign-in that opens no session: the message is for the person, `status` for HTTP;
    `loopback`, the CLI's address when a `trainyard login --sso` waits for the answer; `field`,
    what of the request it refuses, where one is to blame."""

    def __init__(
        self,
        status: int,
        message: str,
        loopback: str | None = None,
        *,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.loopback = loopback
        self.field = field


@dataclass(frozen=True, slots=True)
class Loopback:
    """A `trainyard login --sso` waiting on the loopback address `uri` (see `loopback`)."""

    uri: str
    challenge: str


@dataclass(frozen=True, slots=True)
class Started:
    """A browser's sign-in on its way to the provider."""

    binding: str
    """The value of the cookie that ties the callback to this browser."""
    url: str


@dataclass(frozen=True, slots=True)
class Opened:
    credential: str
    """The cookie's value, or the CLI's bearer token (or one-time code, with `loopback`): never
    stored, only its sha256."""
    principal: Principal
    csrf: str | None
    expires_at: datetime
    loopback: str | None = None
    """Where the browser takes the one-time code: the waiting CLI's address."""


@dataclass(frozen=True, slots=True)
class Live:
    principal: Principal
    csrf: str | None
    expires_at: datetime


def digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


class Identity:
    def __init__(self, config: IdentityConfig, provider: OidcProvider, pool: asyncpg.Pool) -> None:
        self.config = config
        self.provider = provider
        self._pool = pool

    async def start_browser(self, redirect_uri: str, cli: Loopback | None = None) -> Started:
        binding, state, nonce = (secrets.token_urlsafe(32) for _ in range(3))
        verifier, challenge = pkce_pair()
        url = await self._provider(
            self.provider.authorization_url(redirect_uri, state, nonce, challenge)
        )
        await self._pool.execute(
            Q["identity_start_login"],
            state,
            digest(binding),
            verifier,
            nonce,
            LOGIN_TTL_S,
            None if cli is None else cli.uri,
            None if cli is None else cli.challenge,
        )
        return Started(binding, url)

    async def finish_browser(
        self, binding: str, state: str, code: str, redirect_uri: str
    ) -> Opened:
        row = await self._pool.fetchrow(Q["identity_take_login"], state, digest(binding))
        if row is None:
            raise SignInRefused(
                400, "this sign-in expired or was started in another browser: sign in again"
            )
        cli = row["cli_redirect"]
        try:
            tokens = await self._grant(
                self.provider.exchange_code(code, row["verifier"], redirect_uri, row["nonce"])
            )
            if cli is None:
                return await self._open("browser", tokens, BROWSER_TTL_S)
            opened = await self._open("cli", tokens, HANDOFF_TTL_S, row["cli_challenge"])
        except SignInRefused as refused:
            refused.loopback = cli
            raise
        return Opened(opened.credential, opened.principal, None, opened.expires_at, cli)

    async def finish_loopback(self, code: str, verifier: str) -> Opened | None:
        """The CLI's session for the one-time code the browser brought it, if `verifier` is the
        one its challenge was made from; None otherwise (or a second time)."""
        credential = CLI_PREFIX + secrets.token_urlsafe(32)
        row = await self._pool.fetchrow(
            Q["identity_collect_handoff"],
            digest(code),
            digest(credential),
            s256(verifier),
            CLI_TTL_S,
        )
        if row is None:
            return None
        who = Principal(tenant=row["tenant"], is_admin=row["is_admin"])
        return Opened(credential, who, None, row["expires_at"])

    async def start_device(self) -> dict[str, Any]:
        """The provider's device authorization (RFC 8628), for `trainyard login`."""
        if not await self._provider(self.provider.supports_device_flow()):
            raise SignInRefused(
                404,
                "the identity provider offers no device flow: `trainyard login --sso` signs in "
                "through a browser on this machine instead",
            )
        return await self._provider(self.provider.device_authorization())

    async def finish_device(self, device_code: str) -> Opened | str:
        """The CLI's session once the person approved; else the provider's word for why not
        yet ("authorization_pending", "slow_down")."""
        try:
            tokens = await self._grant(self.provider.device_token(device_code))
        except _Pending as pending:
            return pending.error
        return await self._open("cli", tokens, CLI_TTL_S)

    async def session(self, credential: str, kind: str) -> Live | None:
        """The live session a credential names, checked with the provider when due; None for
        one unknown, ended, expired, or that the provider no longer vouches for."""
        sha = digest(credential)
        row = await self._pool.fetchrow(
            Q["identity_session"], sha, kind, self.config.check_interval_s
        )
        if row is None:
            return None
        if row["due"]:
            return await self._check(sha)
        return _live(row)

    async def end(self, credential: str, reason: str) -> Ended:
        """End the session a credential names (a sign-out), and revoke its refresh token at the
        provider, so that the person's grant to Trainyard ends there too. The session ends here
        whatever the provider says: one that cannot be reached leaves only its own token valid
        until the provider expires it."""
        row = await self._pool.fetchrow(Q["identity_end_session"], digest(credential), reason)
        if row is None:
            return Ended.NOTHING
        if row["refresh_token"] is None:
            return Ended.ENDED
        try:
            revoked = await self.provider.revoke(row["refresh_token"])
        except ProviderError as exc:
            log.warning("a signed-out session's refresh token was not revoked: %s", exc)
            return Ended.ENDED
        return Ended.REVOKED if revoked else Ended.ENDED

    async def _check(self, sha: str) -> Live | None:
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(Q["identity_lock_session"], sha, self.config.check_interval_s)
            if row is None:
                return None
            if not row["due"]:  # another request checked it while this one waited
                return _live(row)
            ended = await self._refreshed(conn, sha, row)
            if ended is not None:
                await conn.execute(Q["identity_end_session"], sha, ended)
                log.info("an identity session ended: %s", ended)
                return None
            row = await conn.fetchrow(Q["identity_lock_session"], sha, self.config.check_interval_s)
        return None if row is None else _live(row)

    async def _refreshed(self, conn: Executor, sha: str, row: Any) -> str | None:
        """Ask the provider (and record its answer); why the session ends, or None."""
        refresh = row["refresh_token"]
        if refresh is None:
            # Nothing to ask with: the session lasts as long as the provider's token.
            return "the provider's token expired" if row["lapsed"] else None
        try:
            tokens = await self.provider.refresh(refresh)
        except Refused as refused:
            return f"the provider refused the session's refresh token ({refused})"
        except (ProviderError, InvalidToken) as exc:
            if row["lapsed"]:
                return f"the provider's token expired and it could not be asked again ({exc})"
            log.warning("the identity provider could not check a session: %s", exc)
            await conn.execute(Q["identity_check_failed"], sha)
            return None
        who = Principal(tenant=row["tenant"], is_admin=row["is_admin"])
        if tokens.claims:
            mapped = self._map(tokens.claims)
            if isinstance(mapped, Unmapped):
                return mapped.message
            who = mapped
        await conn.execute(
            Q["identity_checked"],
            sha,
            who.tenant,
            who.is_admin,
            tokens.refresh_token,
            tokens.expires_at,
        )
        return None

    def _map(self, claims: dict[str, Any]) -> Principal | Unmapped:
        who = claims.get("email") if isinstance(claims.get("email"), str) else None
        groups = groups_of(claims, self.config.groups_claim)
        return principal_for(self.config.mapping, who or f"subject {claims['sub']!r}", groups)

    async def _open(
        self, kind: str, tokens: Tokens, ttl_s: float, handoff: str | None = None
    ) -> Opened:
        mapped = self._map(tokens.claims)
        if isinstance(mapped, Unmapped):
            raise SignInRefused(403, mapped.message)
        if mapped.tenant is not None and not await self._pool.fetchval(
            Q["identity_tenant_exists"], mapped.tenant
        ):
            raise SignInRefused(
                403,
                f"your groups map to the tenant {mapped.tenant!r}, which does not exist: ask "
                "the operator to create it (trainyard tenants create)",
            )
        if kind == "cli":
            credential, csrf = CLI_PREFIX + secrets.token_urlsafe(32), None
        else:
            credential, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        email = tokens.claims.get("email")
        expires_at = await self._pool.fetchval(
            Q["identity_open_session"],
            digest(credential),
            kind,
            str(tokens.claims["sub"]),
            email if isinstance(email, str) else None,
            mapped.tenant,
            mapped.is_admin,
            csrf,
            tokens.refresh_token,
            tokens.expires_at,
            ttl_s,
            handoff,
        )
        return Opened(credential, mapped, csrf, expires_at)

    async def _grant(self, pending: Awaitable[Tokens]) -> Tokens:
        """A token request's answer; SignInRefused saying why there is none."""
        try:
            tokens = await pending
        except Refused as refused:
            if refused.error in ("authorization_pending", "slow_down"):
                raise _Pending(refused.error) from refused
            raise SignInRefused(
                401, f"the identity provider refused the sign-in ({refused})"
            ) from refused
        except InvalidToken as exc:
            raise SignInRefused(
                401, f"the identity provider's ID token is not valid: {exc}"
            ) from exc
        except ProviderError as exc:
            raise SignInRefused(502, str(exc)) from exc
        return tokens

    async def _provider(self, pending: Awaitable[T]) -> T:
        try:
            return await pending
        except (ProviderError, Refused) as exc:
            raise SignInRefused(502, f"the identity provider failed: {exc}") from exc


class _Pending(Exception):
    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


def _live(row: Any) -> Live:
    return Live(
        Principal(tenant=row["tenant"], is_admin=row["is_admin"]), row["csrf"], row["expires_at"]
    )
