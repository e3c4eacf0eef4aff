"""Tenant commands against the event store: create a tenant, issue and revoke its tokens.

Decisions are taken on the tenant's own stream, the only truth; after appending, each command
brings the `tenants` projection up to date so that a token it issued authenticates at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from pydantic import ValidationError

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.database import Executor
from controlplane.events.commands import Executed
from controlplane.events.metadata import Metadata
from controlplane.events.records import LogPosition
from controlplane.events.store import EventStore
from controlplane.projections.runner import ProjectionRunner
from controlplane.queries import Q
from controlplane.tenants.errors import InvalidTenant, UnknownToken
from controlplane.tenants.events import (
    TenantCreated,
    TenantEvent,
    TenantLimitsSet,
    TenantUpdated,
    TokenIssued,
    TokenRevoked,
)
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.principals import TRUSTED_S
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.state import TENANT, Change, Create, TenantCommand, TenantState
from controlplane.tenants.streams import tenant_stream
from controlplane.tenants.tokens import IssuedToken, new_token
from controlplane.tenants.validation import check_gpu_quota, check_name, check_weight

LIMIT_NAMES = tuple(TenantLimits.model_fields)


class _Keep(Enum):
    KEEP = "keep"


KEEP = _Keep.KEEP
"""For `update_tenant`: leave this setting as it is."""


@dataclass(frozen=True, slots=True)
class TenantSummary:
    name: str
    weight: float
    gpu_quota: int | None
    created_at: datetime
    active_tokens: tuple[str, ...]
    """The ids of its tokens that are not revoked, oldest first."""
    limits: TenantLimits


async def create_tenant(
    store: EventStore,
    runner: ProjectionRunner,
    name: str,
    weight: float = 1.0,
    gpu_quota: int | None = None,
    *,
    actor: str,
    clock: Clock = SYSTEM_CLOCK,
) -> IssuedToken:
    """Create a tenant with its first token; InvalidTenant or TenantExists write nothing."""
    created = TenantCreated(
        name=check_name(name),
        weight=check_weight(weight),
        gpu_quota=check_gpu_quota(gpu_quota),
        at=clock.now(),
    )
    token = new_token()
    await _execute(store, runner, name, Create(name, [created, _issued(token, created.at)]), actor)
    return token


async def issue_token(
    store: EventStore,
    runner: ProjectionRunner,
    name: str,
    *,
    revoke_others: bool = False,
    actor: str,
    clock: Clock = SYSTEM_CLOCK,
) -> IssuedToken:
    """Issue another token for a tenant, and with `revoke_others` revoke all its others."""
    token, at = new_token(), clock.now()

    def change(tenant: TenantState) -> list[TenantEvent]:
        revoked = sorted(tenant.active_tokens) if revoke_others else []
        return [_issued(token, at), *(TokenRevoked(token_id=t, at=at) for t in revoked)]

    await _execute(store, runner, name, Change(name, change), actor)
    return token


async def revoke_token(
    store: EventStore,
    runner: ProjectionRunner,
    name: str,
    token_id: str,
    *,
    actor: str,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Revoke one of a tenant's tokens; it stops authenticating once this returns."""
    at = clock.now()

    def change(tenant: TenantState) -> list[TenantEvent]:
        if token_id not in tenant.active_tokens:
            raise UnknownToken(
                f"tenant {name!r} has no active token {token_id!r}; nothing was written"
            )
        return [TokenRevoked(token_id=token_id, at=at)]

    await _execute(store, runner, name, Change(name, change), actor)


async def update_tenant(
    store: EventStore,
    runner: ProjectionRunner,
    name: str,
    *,
    weight: float | _Keep = KEEP,
    gpu_quota: int | _Keep | None = KEEP,
    actor: str,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Change a tenant's weight or GPU quota (None: no quota); claims use them at once."""
    if weight is not KEEP:
        check_weight(weight)
    if gpu_quota is not KEEP:
        check_gpu_quota(gpu_quota)

    at = clock.now()

    def change(tenant: TenantState) -> list[TenantEvent]:
        return [
            TenantUpdated(
                weight=tenant.weight if weight is KEEP else weight,
                gpu_quota=tenant.gpu_quota if gpu_quota is KEEP else gpu_quota,
                at=at,
            )
        ]

    await _execute(store, runner, name, Change(name, change), actor)


async def set_limits(
    store: EventStore,
    runner: ProjectionRunner,
    name: str,
    changes: Mapping[str, object],
    *,
    actor: str,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Change some of a tenant's limits (the others stay); the next submission, stream and
    job use them. InvalidTenant (a value out of range, an unknown limit) writes nothing."""
    if not changes:
        raise InvalidTenant(f"no limit to change; give one or more of {', '.join(LIMIT_NAMES)}")
    unknown = sorted(set(changes) - set(LIMIT_NAMES))
    if unknown:
        raise InvalidTenant(
            f"unknown limit(s) {', '.join(unknown)}; known: {', '.join(LIMIT_NAMES)}"
        )

    at = clock.now()

    def change(tenant: TenantState) -> list[TenantEvent]:
        try:
            limits = TenantLimits.model_validate({**tenant.limits.model_dump(), **changes})
        except ValidationError as exc:
            raise InvalidTenant(
                f"invalid limits: {_first_problem(exc)}; nothing was written"
            ) from None
        return [TenantLimitsSet(limits=limits, at=at)]

    await _execute(store, runner, name, Change(name, change), actor)


def _first_problem(exc: ValidationError) -> str:
    problem = exc.errors()[0]
    where = ".".join(str(p) for p in problem["loc"])
    return f"{where}: {problem['msg']}"


async def list_tenants(db: Executor, name: str | None = None) -> list[TenantSummary]:
    """Every tenant (or only `name`) by name, from the `tenants` projection."""
    return [
        TenantSummary(
            name=row["name"],
            weight=row["weight"],
            gpu_quota=row["gpu_quota"],
            created_at=row["created_at"],
            active_tokens=tuple(row["active_tokens"]),
            limits=TenantLimits.model_validate_json(row["limits"]),
        )
        for row in await db.fetch(Q["list_tenants"], name)
    ]


async def project_now(runner: ProjectionRunner, through: LogPosition) -> None:
    """Wait until the `tenants` projection has applied the log through `through`, so that a
    new token works, and a revoked one stops working, once the command returns."""
    await runner.wait_applied(TenantsProjection.name, through)


async def _execute(
    store: EventStore, runner: ProjectionRunner, name: str, command: TenantCommand, actor: str
) -> None:
    """Carry out `command` on the tenant's stream (deciding again after a conflict), then
    wait for the projection."""
    stream = tenant_stream(check_name(name))
    metadata = Metadata.capture(actor, tenant=name)
    executed: Executed[TenantState | None, TenantEvent] = await TENANT.execute(
        store, stream, command, metadata
    )
    if executed.appended is not None:  # else nothing changed: nothing to wait for
        await project_now(runner, executed.appended.log_position)
    if any(isinstance(event, TokenRevoked) for event in executed.events):
        # Every control plane trusts a live token it looked up for TRUSTED_S: past that, none
        # still does, so a revoked token stops authenticating once this returns.
        await asyncio.sleep(TRUSTED_S)


def _issued(token: IssuedToken, at: datetime) -> TokenIssued:
    return TokenIssued(token_id=token.token_id, token_sha256=token.sha256, at=at)
