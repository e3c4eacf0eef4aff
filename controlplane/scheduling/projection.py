"""The `scheduling` projection: the one row of `scheduling_policy`, the claim policy in force,
which claims read in their own statement (`claim_candidates`)."""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.database import Executor
from controlplane.events.records import RecordedEvent
from controlplane.queries import Q
from controlplane.scheduling.events import SchedulingPolicySet
from controlplane.scheduling.streams import CATEGORY


class SchedulingProjection:
    name = "scheduling"
    tables: Sequence[str] = ("scheduling_policy",)
    categories: frozenset[str] | None = frozenset({CATEGORY})

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        # Each event says the whole policy: the batch's last is what holds.
        last = next(
            (r.event for r in reversed(events) if isinstance(r.event, SchedulingPolicySet)), None
        )
        if last is not None:
            await conn.execute(
                Q["set_scheduling_policy"],
                str(last.order),
                last.quotas,
                last.actor,
                last.at,
                last.reason,
            )
