"""The dashboard's sessions: a browser trades a bearer token for a session once, then sends
the session's cookie (HttpOnly, SameSite=Strict), since an EventSource cannot send an
Authorization header. Every request a cookie authenticates that changes something must also
carry the session's CSRF token in `X-CSRF-Token` (the page reads it from `GET /ui/session`;
another site can neither read it nor make the browser send the cookie).

A session is only as good as its token: revoking the token ends it at once (the lookup joins
the live tokens), and it expires after SESSION_TTL_S whatever happens."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from controlplane.database import Executor
from controlplane.queries import Q
from controlplane.tenants.principals import Principal
from controlplane.tenants.tokens import PREFIX, token_sha256

COOKIE = "trainyard_session"
CSRF_HEADER = "X-CSRF-Token"
SESSION_TTL_S = 8 * 3600.0
"""A working day: a browser left signed in on a shared machine is not signed in for good."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class Session:
    principal: Principal
    csrf: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Opened:
    cookie: str
    csrf: str
    expires_at: datetime


def _digest(cookie: str) -> str:
    return hashlib.sha256(cookie.encode()).hexdigest()


async def open_session(db: Executor, token: str) -> Opened | None:
    """A new session for a live token; None for an unknown or revoked one."""
    if not token.startswith(PREFIX) or not token.isascii():
        return None
    cookie, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    expires_at = await db.fetchval(
        Q["open_session"], _digest(cookie), token_sha256(token), csrf, SESSION_TTL_S
    )
    return None if expires_at is None else Opened(cookie, csrf, expires_at)


async def session(db: Executor, cookie: str) -> Session | None:
    """The live session a cookie names; None for one expired, ended, revoked or unknown."""
    if not cookie.isascii() or len(cookie) > 100:
        return None
    row = await db.fetchrow(Q["session_principal"], _digest(cookie))
    if row is None:
        return None
    who = Principal(tenant=row["tenant"], is_admin=row["is_admin"])
    return Session(who, row["csrf"], row["expires_at"])


async def end_session(db: Executor, cookie: str) -> None:
    await db.execute(Q["end_session"], _digest(cookie))


def csrf_ok(method: str, sent: str | None, expected: str) -> bool:
    """Whether a request a cookie authenticates may proceed: a safe method, or the session's
    CSRF token sent (compared in constant time)."""
    if method in SAFE_METHODS:
        return True
    return sent is not None and hmac.compare_digest(sent.encode(), expected.encode())
