"""Tenants' webhook signing secrets: issued (or rotated), and read to sign deliveries.

A tenant has one current secret. Rotating issues a new one and retires the old, which signs
deliveries too for `GRACE` more, so that a receiver can switch secrets without refusing any
delivery. The relay issues a tenant's first secret itself when a delivery needs one, so every
delivery is signed; the tenant reads it (`GET /v1/webhook-secret`) or rotates it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import asyncpg

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.database import Executor
from controlplane.events.commands import retry_on_conflict
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.queries import Q
from controlplane.tenants.state import TENANT, Change, TenantState
from controlplane.tenants.streams import tenant_stream
from controlplane.tenants.validation import check_name
from controlplane.webhooks.events import WebhookSecretRotated

GRACE = timedelta(hours=24)
PREFIX = "whsec_"
"""Makes a leaked secret recognisable, as `ty_` does for API tokens."""


@dataclass(frozen=True, slots=True)
class IssuedSecret:
    tenant: str
    secret_id: str
    created_at: datetime
    previous_valid_until: datetime | None
    """Until when the secret it replaced still signs deliveries; None: it replaced none."""
    secret: str = field(repr=False)  # kept out of logs and tracebacks


@dataclass(frozen=True, slots=True)
class SigningSecret:
    secret_id: str
    created_at: datetime
    valid_until: datetime | None
    """None for the current secret; for a retired one, the end of its grace period."""
    secret: str = field(repr=False)


async def rotate(
    pool: asyncpg.Pool,
    store: EventStore,
    tenant: str,
    *,
    actor: str,
    unless_present: bool = False,
    clock: Clock = SYSTEM_CLOCK,
) -> IssuedSecret | None:
    """Issue a new secret for the tenant, retiring its current one (after GRACE); with
    `unless_present`, only when it has none (None comes back when it had one). The secret and
    its event (`WebhookSecretRotated`, on the tenant's stream, without the secret) commit
    together. UnknownTenant, or TenantBusy after repeated conflicts, write nothing."""
    stream = tenant_stream(check_name(tenant))
    metadata = Metadata.capture(actor, tenant=tenant)

    async def attempt() -> IssuedSecret | None:
        # Each try a transaction of its own: after a conflict (another tenant command, a token
        # issued, appended meanwhile) everything here rolled back.
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(Q["lock_webhook_secrets"], tenant)
            current = bool(await conn.fetchval(Q["has_webhook_secret"], tenant))
            if unless_present and current:
                return None
            at = clock.now()
            issued = IssuedSecret(
                tenant=tenant,
                secret_id="whs_" + secrets.token_hex(8),
                created_at=at,
                previous_valid_until=at + GRACE if current else None,
                # 32 random bytes, as for API tokens: far beyond guessing.
                secret=PREFIX + secrets.token_urlsafe(32),
            )

            def change(_: TenantState) -> list[WebhookSecretRotated]:
                rotated = WebhookSecretRotated(
                    secret_id=issued.secret_id,
                    previous_valid_until=issued.previous_valid_until,
                    at=at,
                )
                return [rotated]

            await TENANT.try_once(store.on(conn), stream, Change(tenant, change), metadata)
            await conn.execute(Q["retire_webhook_secret"], tenant, at)
            await conn.execute(
                Q["insert_webhook_secret"], issued.secret_id, tenant, issued.secret, at
            )
            return issued

    return await retry_on_conflict(attempt, lambda tries: TENANT.busy(stream, tries))


async def signing_secrets(db: Executor, tenant: str) -> list[SigningSecret]:
    """The secrets deliveries to the tenant are signed with now: the current one first."""
    rows = await db.fetch(Q["webhook_signing_secrets"], tenant, GRACE.total_seconds())
    return [
        SigningSecret(
            secret_id=row["secret_id"],
            created_at=row["created_at"],
            valid_until=None if row["retired_at"] is None else row["retired_at"] + GRACE,
            secret=row["secret"],
        )
        for row in rows
    ]
