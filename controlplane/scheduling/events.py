"""The events of the scheduling stream (`scheduling-policy`): the claim policy an operator set,
each change one event."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from controlplane.events.types import Event, event_type
from controlplane.scheduling.policy import ClaimPolicy, Order


class SchedulingEvent(Event):
    at: datetime


@event_type("SchedulingPolicySet")
class SchedulingPolicySet(SchedulingEvent):
    """The claim policy from now on: claims take queued jobs in `order`, within tenants' GPU
    quotas or not."""

    order: Order
    quotas: bool = Field(description="whether tenants' GPU quotas hold")
    actor: str
    reason: str | None = None
    """What the operator said of it (None: nothing)."""

    @property
    def policy(self) -> ClaimPolicy:
        return ClaimPolicy(self.order, self.quotas)


EVENT_TYPES: tuple[type[Event], ...] = (SchedulingPolicySet,)
"""This feature's event types, for the registry (see `controlplane.event_registry`)."""
