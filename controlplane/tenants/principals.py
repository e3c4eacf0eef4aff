"""Who a request comes from, and the token lookup that says so: the read model behind
authentication, for every front end (HTTP, dashboard, CLI).

A token is looked up by its sha256 in `api_tokens`, and a live one is then trusted for
`TRUSTED_S` from the start of the read that found it live, by the process that read it. While
a token is in use, the process reads it again in the background (`run`: every token it
trusts, in one statement, each REFRESH_S), so that a request with a known token never waits
for Postgres. A revocation still takes effect on every control plane before it returns,
because it returns only once `TRUSTED_S` has passed after its projection
(`tenants.service`): every trust given by a read from before it has expired by then, and every
read since finds the token revoked. So a revoked token is refused by every process at most
`TRUSTED_S` after its revocation commits, as likely as not within one REFRESH_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.database import DATABASE_ERRORS, Executor
from controlplane.queries import Q
from controlplane.tenants.tokens import PREFIX, token_sha256

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: a tenant, or the admin (who has no tenant)."""

    tenant: str | None
    is_admin: bool

    def __post_init__(self) -> None:
        if self.is_admin != (self.tenant is None):
            raise ValueError("a principal is either the admin or exactly one tenant")

    def may_see(self, tenant: str) -> bool:
        """Whether this principal may see and change what belongs to `tenant`."""
        return self.is_admin or self.tenant == tenant


TRUSTED_S = 0.5
"""How long a process trusts a token it found live, counted from the start of that read."""
REFRESH_S = TRUSTED_S / 2
"""How often the tokens a process trusts are read again: well inside TRUSTED_S, so that a
token in use stays trusted while the reads succeed (a read may wait for the event loop and a
connection as long again) and no request waits for its lookup."""
IDLE_S = 60.0
"""A token no request has shown this long is not read again but forgotten: the next request
with it looks it up."""
MAX_TRUSTED = 10_000
"""Live tokens a process keeps at most (the least recently used go first): only tokens that
authenticated are kept, so no one fills it with guesses."""


@dataclass(slots=True)
class _Trust:
    until: float
    """This process's monotonic clock: TRUSTED_S after the start of the read that found it."""
    who: Principal
    used: float
    """When a request last showed it."""


class Principals:
    """Who holds which token: the lookup, the live tokens trusted for `TRUSTED_S`, and (`run`)
    their reading again in the background."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._trusted: OrderedDict[str, _Trust] = OrderedDict()
        """By token sha256, the least recently used first."""
        self._stopping = asyncio.Event()

    async def authenticate(self, db: Executor, token: str) -> Principal | None:
        """The holder of a live token; None for an unknown or revoked one."""
        if not token.startswith(PREFIX) or not token.isascii():
            # Not one of ours (they are ASCII): no need to ask the database. A header's bytes
            # that are not UTF-8 arrive as surrogates, which would not even hash.
            return None
        digest = token_sha256(token)
        # Trusted from before the lookup began: a revocation committed during it is one the
        # lookup may not have seen, and its wait counts from its commit.
        asked = self._clock()
        trusted = self._trusted.get(digest)
        if trusted is not None and asked < trusted.until:
            trusted.used = asked
            self._trusted.move_to_end(digest)
            return trusted.who
        row = await db.fetchrow(Q["authenticate_token"], digest)
        if row is None:
            self._trusted.pop(digest, None)
            return None
        who = Principal(tenant=row["tenant"], is_admin=row["is_admin"])
        self._trusted[digest] = _Trust(asked + TRUSTED_S, who, asked)
        self._trusted.move_to_end(digest)
        while len(self._trusted) > MAX_TRUSTED:
            self._trusted.popitem(last=False)
        return who

    async def refresh(self, db: Executor) -> None:
        """Read every token trusted here again, in one statement: a live one is trusted anew
        for TRUSTED_S from the read's start; a revoked one is forgotten (refused from now);
        one unused for IDLE_S is forgotten unread."""
        asked = self._clock()
        while self._trusted:
            digest, oldest = next(iter(self._trusted.items()))
            if asked - oldest.used <= IDLE_S:
                break  # least recently used first: the rest were used since
            del self._trusted[digest]
        if not self._trusted:
            return
        digests = list(self._trusted)
        rows = await db.fetch(Q["authenticate_tokens"], digests)
        live = {row["token_sha256"]: row for row in rows}
        for digest in digests:
            trusted = self._trusted.get(digest)
            if trusted is None:
                continue  # forgotten meanwhile
            row = live.get(digest)
            if row is None:
                del self._trusted[digest]  # revoked: a revocation is for good
                continue
            trusted.who = Principal(tenant=row["tenant"], is_admin=row["is_admin"])
            # A lookup during this read, begun after it, may have trusted it longer already.
            trusted.until = max(trusted.until, asked + TRUSTED_S)

    async def run(self, db: Executor) -> None:
        """`refresh` each REFRESH_S until `stop()`. A failed read is logged and tried again
        at the next turn: meanwhile the trust runs out, and requests look their tokens up as
        they would without this."""
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFRESH_S):
                    await self._stopping.wait()
            if self._stopping.is_set():
                return
            try:
                await self.refresh(db)
            except DATABASE_ERRORS as exc:
                log.warning("reading the trusted tokens again failed: %s", exc)

    def stop(self) -> None:
        self._stopping.set()
