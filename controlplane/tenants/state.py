"""A tenant as its stream (`tenant-<name>`) has it, and how commands are decided on it: the
tenants' aggregate for the command path (events/commands.py). No I/O here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from controlplane.events.commands import Aggregate
from controlplane.tenants.errors import TenantBusy, TenantExists, UnknownTenant
from controlplane.tenants.events import (
    TenantCreated,
    TenantEvent,
    TenantLimitsSet,
    TenantUpdated,
    TokenIssued,
    TokenRevoked,
)
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.streams import tenant_of


@dataclass(frozen=True, slots=True)
class TenantState:
    """A tenant as its stream has it: what commands decide on."""

    weight: float
    gpu_quota: int | None
    active_tokens: frozenset[str]
    """The ids of its tokens that are not revoked."""
    limits: TenantLimits


@dataclass(frozen=True, slots=True)
class Create:
    """Start the tenant's stream with `events` (its TenantCreated first)."""

    name: str
    events: Sequence[TenantEvent]


@dataclass(frozen=True, slots=True)
class Change:
    """Change an existing tenant: `change` gives the events from its state."""

    name: str
    change: Callable[[TenantState], Sequence[TenantEvent]]


TenantCommand = Create | Change


def decide(command: TenantCommand, tenant: TenantState | None) -> Sequence[TenantEvent]:
    match command:
        case Create():
            if tenant is not None:
                raise TenantExists(f"tenant {command.name!r} already exists; nothing was written")
            return command.events
        case Change():
            if tenant is None:
                raise UnknownTenant(f"no tenant named {command.name!r}; nothing was written")
            return command.change(tenant)


def evolve(tenant: TenantState | None, event: TenantEvent) -> TenantState:
    # A stream starts with TenantCreated; the defaults are for one that (wrongly) does not.
    state = tenant or TenantState(1.0, None, frozenset(), TenantLimits())
    match event:
        case TenantCreated() | TenantUpdated():
            return replace(state, weight=event.weight, gpu_quota=event.gpu_quota)
        case TenantLimitsSet():
            return replace(state, limits=event.limits)
        case TokenIssued():
            return replace(state, active_tokens=state.active_tokens | {event.token_id})
        case TokenRevoked():
            return replace(state, active_tokens=state.active_tokens - {event.token_id})
    return state  # events that change nothing decided on here (webhook secrets)


def _busy(stream_id: str, tries: int) -> TenantBusy:
    return TenantBusy(
        f"tenant {tenant_of(stream_id)!r} kept changing; gave up after {tries} tries; "
        "nothing was written"
    )


TENANT: Aggregate[TenantCommand, TenantState | None, TenantEvent] = Aggregate(
    event_type=TenantEvent, initial=None, decide=decide, evolve=evolve, busy=_busy
)
"""A tenant's stream, for the command path."""
