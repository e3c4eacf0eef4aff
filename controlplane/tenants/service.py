"""Tenant commands against the event store: create a tenant, issue and revoke its tokens.

Decisions are taken on the tenant's own stream, the only truth; after appending, each command
brings the `tenants` projection up to date so that a token it issued authenticates at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

from pydantic import ValidationError

from controlplane.database import Executor
from controlplane.events.errors import ConcurrencyError
from controlplane.events.metadata import Metadata
from controlplane.events.records import LogPosition
from controlplane.events.store import EventStore
from controlplane.events.types import Event
from controlplane.projections.runner import ProjectionRunner
from controlplane.queries import Q
from controlplane.tenants.errors import (
    InvalidTenant,
    TenantBusy,
    TenantExists,
    UnknownTenant,
    UnknownToken,
)
from controlplane.tenants.events import (
    TenantCreated,
    TenantLimitsSet,
    TenantUpdated,
    TokenIssued,
    TokenRevoked,
)
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.streams import tenant_stream
from controlplane.tenants.tokens import IssuedToken, new_token
from controlplane.tenants.validation import check_gpu_quota, check_name, check_weight

CONFLICT_RETRIES = 10
LIMIT_NAMES = tuple(TenantLimits.model_fields)


class _Keep(Enum):
    KEEP = "keep"


KEEP = _Keep.KEEP
"""For `update_tenant`: leave this setting as it is."""


@dataclass(frozen=True, slots=True)
class TenantState:
    """A tenant as its stream has it: what commands decide on."""

    weight: float
    gpu_quota: int | None
    active_tokens: frozenset[str]
    """The ids of its tokens that are not revoked."""
    limits: TenantLimits


Decide = Callable[[TenantState, datetime], Sequence[Event]]
"""From the tenant's state and the time now, the events to append."""


@dataclass(frozen=True, slots=True)
class TenantSummary:
    name: str
    weight: float
    gpu_quota: int | None
    created_at: datetime
    active_tokens: tuple[str, ...]
    """The ids of its tokens that are not revoked, oldest first."""
    limits: TenantLimits


def now() -> datetime:
    return datetime.now(UTC)


async def create_tenant(
    store: EventStore,
    runner: ProjectionRunner,
    name: str,
    weight: float = 1.0,
    gpu_quota: int | None = None,
    *,
    actor: str,
) -> IssuedToken:
    """Create a tenant with its first token; InvalidTenant or TenantExists write nothing."""
    created = TenantCreated(
        name=check_name(name),
        weight=check_weight(weight),
        gpu_quota=check_gpu_quota(gpu_quota),
        at=now(),
    )
    token = new_token()
    try:
        appended = await store.append(
            tenant_stream(name),
            0,
            [created, _issued(token, created.at)],
            Metadata.capture(actor, tenant=name),
        )
    except ConcurrencyError:
        raise TenantExists(f"tenant {name!r} already exists; nothing was written") from None
    await project_now(runner, appended.log_position)
    return token


async def issue_token(
    store: EventStore,
    runner: ProjectionRunner,
    name: str,
    *,
    revoke_others: bool = False,
    actor: str,
) -> IssuedToken:
    """Issue another token for a tenant, and with `revoke_others` revoke all its others."""
    token = new_token()

    def decide(tenant: TenantState, at: datetime) -> list[Event]:
        revoked = sorted(tenant.active_tokens) if revoke_others else []
        return [_issued(token, at), *(TokenRevoked(token_id=t, at=at) for t in revoked)]

    await project_now(runner, await _change(store, name, decide, actor))
    return token


async def revoke_token(
    store: EventStore, runner: ProjectionRunner, name: str, token_id: str, *, actor: str
) -> None:
    """Revoke one of a tenant's tokens; it stops authenticating once this returns."""

    def decide(tenant: TenantState, at: datetime) -> list[Event]:
        if token_id not in tenant.active_tokens:
            raise UnknownToken(
                f"tenant {name!r} has no active token {token_id!r}; nothing was written"
            )
        return [TokenRevoked(token_id=token_id, at=at)]

    await project_now(runner, await _change(store, name, decide, actor))


async def update_tenant(
    store: EventStore,
    runner: ProjectionRunner,
    name: str,
    *,
    weight: float | _Keep = KEEP,
    gpu_quota: int | _Keep | None = KEEP,
    actor: str,
) -> None:
    """Change a tenant's weight or GPU quota (None: no quota); claims use them at once."""
    if weight is not KEEP:
        check_weight(weight)
    if gpu_quota is not KEEP:
        check_gpu_quota(gpu_quota)

    def decide(tenant: TenantState, at: datetime) -> list[Event]:
        return [
            TenantUpdated(
                weight=tenant.weight if weight is KEEP else weight,
                gpu_quota=tenant.gpu_quota if gpu_quota is KEEP else gpu_quota,
                at=at,
            )
        ]

    await project_now(runner, await _change(store, name, decide, actor))


async def set_limits(
    store: EventStore,
    runner: ProjectionRunner,
    name: str,
    changes: Mapping[str, object],
    *,
    actor: str,
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

    def decide(tenant: TenantState, at: datetime) -> list[Event]:
        try:
            limits = TenantLimits.model_validate({**tenant.limits.model_dump(), **changes})
        except ValidationError as exc:
            raise InvalidTenant(
                f"invalid limits: {_first_problem(exc)}; nothing was written"
            ) from None
        return [TenantLimitsSet(limits=limits, at=at)]

    await project_now(runner, await _change(store, name, decide, actor))


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


def tenant_state(events: Iterable[Event]) -> TenantState:
    """The tenant folded from its stream's events (which start with TenantCreated)."""
    weight, gpu_quota = 1.0, None
    limits = TenantLimits()
    active: set[str] = set()
    for event in events:
        match event:
            case TenantCreated() | TenantUpdated():
                weight, gpu_quota = event.weight, event.gpu_quota
            case TenantLimitsSet():
                limits = event.limits
            case TokenIssued():
                active.add(event.token_id)
            case TokenRevoked():
                active.discard(event.token_id)
    return TenantState(weight, gpu_quota, frozenset(active), limits)


async def _change(store: EventStore, name: str, decide: Decide, actor: str) -> LogPosition:
    """Decide on the tenant's latest state and append, deciding again after a conflict."""
    stream = tenant_stream(check_name(name))
    for _ in range(CONFLICT_RETRIES):
        history = await store.read_stream(stream)
        if not history:
            raise UnknownTenant(f"no tenant named {name!r}; nothing was written")
        events = decide(tenant_state(r.event for r in history), now())
        try:
            appended = await store.append(
                stream, len(history), events, Metadata.capture(actor, tenant=name)
            )
        except ConcurrencyError:
            # Another command changed the tenant meanwhile: decide again on its new state.
            continue
        return appended.log_position
    raise TenantBusy(
        f"tenant {name!r} kept changing; gave up after {CONFLICT_RETRIES} tries; "
        "nothing was written"
    )


def _issued(token: IssuedToken, at: datetime) -> TokenIssued:
    return TokenIssued(token_id=token.token_id, token_sha256=token.sha256, at=at)
