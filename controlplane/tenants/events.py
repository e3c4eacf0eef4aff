"""The events of a tenant's stream (`tenant-<name>`) and of the admin's (`system-admin`)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from controlplane.events.types import Event, event_type
from controlplane.tenants.limits import TenantLimits


class TenantEvent(Event):
    at: datetime


@event_type("TenantCreated")
class TenantCreated(TenantEvent):
    name: str
    weight: float = Field(description="the tenant's share of the cluster relative to others")
    gpu_quota: int | None = Field(description="GPUs the tenant may hold at once; None: no quota")


@event_type("TenantUpdated")
class TenantUpdated(TenantEvent):
    """The tenant's share and quota from now on (both, whichever changed)."""

    weight: float = Field(description="the tenant's share of the cluster relative to others")
    gpu_quota: int | None = Field(description="GPUs the tenant may hold at once; None: no quota")


@event_type("TenantLimitsSet")
class TenantLimitsSet(TenantEvent):
    """The tenant's limits from now on (all of them, whichever changed); jobs submitted
    earlier keep the limits they were accepted with."""

    limits: TenantLimits


@event_type("TokenIssued")
class TokenIssued(TenantEvent):
    """A bearer token for the stream's tenant."""

    token_id: str
    token_sha256: str = Field(description="hex sha256 of the token; the token is never stored")


@event_type("TokenRevoked")
class TokenRevoked(TenantEvent):
    token_id: str


@event_type("AdminTokenIssued")
class AdminTokenIssued(TenantEvent):
    """The admin's bearer token, issued once when the control plane first starts."""

    token_id: str
    token_sha256: str = Field(description="hex sha256 of the token; the token is never stored")


EVENT_TYPES: tuple[type[Event], ...] = (
    TenantCreated,
    TenantUpdated,
    TenantLimitsSet,
    TokenIssued,
    TokenRevoked,
    AdminTokenIssued,
)
"""This feature's event types, for the registry (see `controlplane.composition`)."""
