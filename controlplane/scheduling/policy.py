"""The claim policy's two choices: the order queued jobs are offered in, and whether tenants'
GPU quotas hold. Production claims with `CURRENT` (what the `claim_candidates` SQL does); the
simulator (`sim/`) replays the recorded past under the others, to compare them before an
operator switches."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Order(StrEnum):
    FAIR_SHARE = "fair_share"
    """The tenant holding the fewest GPUs for its weight first; within a tenant, priority, then
    submission time."""
    PRIORITY = "priority"
    """Priority (highest first), then submission time, across tenants: no fair share."""
    FIFO = "fifo"
    """Submission time alone, across tenants."""


@dataclass(frozen=True, slots=True)
class ClaimPolicy:
    order: Order = Order.FAIR_SHARE
    quotas: bool = True
    """Whether a tenant's GPU quota caps what it may hold; off, only room limits it."""


CURRENT = ClaimPolicy()
"""The policy the claim SQL carries out."""
