"""Who a request comes from, and the token lookup that says so: the read model behind
authentication, for every front end (HTTP, dashboard, CLI).

A token is looked up by its sha256 in `api_tokens` on every request, so a revocation takes
effect at once (one primary-key lookup; no cache to go stale).
"""

from __future__ import annotations

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


async def authenticate(db: Executor, token: str) -> Principal | None:
    """The holder of a live token; None for an unknown or revoked one."""
    if not token.startswith(PREFIX) or not token.isascii():
        # Not one of ours (they are ASCII): no need to ask the database. A header's bytes
        # that are not UTF-8 arrive as surrogates, which would not even hash.
        return None
    row = await db.fetchrow(Q["authenticate_token"], token_sha256(token))
    if row is None:
        return None
    return Principal(tenant=row["tenant"], is_admin=row["is_admin"])
