"""The `tenants` projection: `tenants` (one row per tenant) and `api_tokens` (every token ever
issued, by its hash, with its holder and whether it was revoked), which authenticates requests."""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.database import Executor
from controlplane.events.records import RecordedEvent
from controlplane.queries import Q
from controlplane.tenants.events import (
    AdminTokenIssued,
    TenantCreated,
    TenantLimitsSet,
    TenantUpdated,
    TokenIssued,
    TokenRevoked,
)
from controlplane.tenants.streams import ADMIN_STREAM, CATEGORY, tenant_of


class TenantsProjection:
    name = "tenants"
    tables: Sequence[str] = ("tenants", "api_tokens")
    categories: frozenset[str] | None = frozenset({CATEGORY, ADMIN_STREAM.partition("-")[0]})

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        # Tenants and tokens change rarely: one statement per event is plenty.
        for event in events:
            await self._apply(conn, event)

    async def _apply(self, conn: Executor, event: RecordedEvent) -> None:
        match event.event:
            case TenantCreated() as created:
                await conn.execute(
                    Q["insert_tenant"],
                    created.name,
                    created.weight,
                    created.gpu_quota,
                    created.at,
                )
            case TenantUpdated() as updated:
                await conn.execute(
                    Q["update_tenant"],
                    tenant_of(event.stream_id),
                    updated.weight,
                    updated.gpu_quota,
                )
            case TenantLimitsSet() as limits:
                await conn.execute(
                    Q["set_tenant_limits"],
                    tenant_of(event.stream_id),
                    limits.limits.model_dump_json(),
                )
            case TokenIssued() as issued:
                await conn.execute(
                    Q["insert_api_token"],
                    issued.token_sha256,
                    issued.token_id,
                    tenant_of(event.stream_id),
                    False,
                    issued.at,
                )
            case AdminTokenIssued() as issued:
                await conn.execute(
                    Q["insert_api_token"],
                    issued.token_sha256,
                    issued.token_id,
                    None,
                    True,
                    issued.at,
                )
            case TokenRevoked() as revoked:
                await conn.execute(Q["revoke_api_token"], revoked.token_id, revoked.at)
