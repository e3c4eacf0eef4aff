"""Who a request comes from, and the token lookup that says so: the read model behind
authentication, for every front end (HTTP, dashboard, CLI).

A token is looked up by its sha256 in `api_tokens`, and a live one is then trusted for
`TRUSTED_S` by the process that looked it up: the lookup was a round trip on every request's
path. A revocation still takes effect on every control plane before it returns, because it
returns only once `TRUSTED_S` has passed after its projection (`tenants.service`): every entry
kept from before it has expired by then, and every lookup since reads it revoked.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.database import Executor
from controlplane.queries import Q
from controlplane.tenants.tokens import PREFIX, token_sha256


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
"""How long a process trusts a token it found live, without asking again."""
MAX_TRUSTED = 10_000
"""Live tokens a process keeps at most (the least recently used go first): only tokens that
authenticated are kept, so no one fills it with guesses."""


class Principals:
    """Who holds which token: the lookup, and the live tokens trusted for `TRUSTED_S`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._trusted: OrderedDict[str, tuple[float, Principal]] = OrderedDict()
        """By token sha256: until when (this process's monotonic clock), and whose."""

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
        if trusted is not None and asked < trusted[0]:
            self._trusted.move_to_end(digest)
            return trusted[1]
        row = await db.fetchrow(Q["authenticate_token"], digest)
        if row is None:
            self._trusted.pop(digest, None)
            return None
        who = Principal(tenant=row["tenant"], is_admin=row["is_admin"])
        self._trusted[digest] = (asked + TRUSTED_S, who)
        self._trusted.move_to_end(digest)
        while len(self._trusted) > MAX_TRUSTED:
            self._trusted.popitem(last=False)
        return who
