"""The claim policy as the API answers it."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.instants import Instant
from controlplane.scheduling.policy import Order


class PolicyView(BaseModel):
    """The claim policy in force: the order claims take queued jobs in, whether tenants' GPU
    quotas hold, and who set it when."""

    order: Order
    quotas: bool
    set_by: str | None = Field(
        description="who set it; null: nobody yet, the default holds (always null for a "
        "tenant's token)"
    )
    set_at: Instant | None = Field(description="when; null: nobody set one yet")
    reason: str | None = Field(
        description="what they said of it (null: nothing; always null for a tenant's token)"
    )
    changed: bool | None = Field(
        default=None,
        description="in the answer to a switch: whether it changed the policy (false: that "
        "policy was in force already, and nothing was written)",
    )
