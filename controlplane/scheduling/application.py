"""The claim policy as the admin manages it: read it, switch it.

A facade as the other features' (`controlplane.tenants.application`): it takes requests
already parsed and authorized, decides on the scheduling stream (`lifecycle`), waits for the
`scheduling` projection so that the next claim follows the new policy, and answers with the
view (`views`). Setting the policy in force writes nothing."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import asyncpg

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.database import Executor
from controlplane.events.metadata import Metadata
from controlplane.events.records import LogPosition, RecordedEvent
from controlplane.events.store import EventStore
from controlplane.projections.runner import ProjectionRunner
from controlplane.queries import Q
from controlplane.scheduling.lifecycle import POLICY, SetPolicy
from controlplane.scheduling.policy import DEFAULT, ClaimPolicy, Order
from controlplane.scheduling.projection import SchedulingProjection
from controlplane.scheduling.requests import PolicyRequest
from controlplane.scheduling.streams import POLICY_STREAM
from controlplane.scheduling.views import PolicyView

log = logging.getLogger(__name__)


async def policy_in_force(db: Executor) -> ClaimPolicy:
    """The claim policy claims follow now (the default while none was set)."""
    row = await db.fetchrow(Q["scheduling_policy"])
    return DEFAULT if row is None else ClaimPolicy(Order(row["claim_order"]), row["quotas"])


class Scheduling:
    def __init__(
        self,
        pool: asyncpg.Pool,
        store: EventStore,
        projections: ProjectionRunner,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._pool = pool
        self._store = store
        self._projections = projections
        self._clock = clock

    async def policy(self) -> PolicyView:
        row = await self._pool.fetchrow(Q["scheduling_policy"])
        if row is None:
            return PolicyView(
                order=DEFAULT.order, quotas=DEFAULT.quotas, set_by=None, set_at=None, reason=None
            )
        return PolicyView(
            order=Order(row["claim_order"]),
            quotas=row["quotas"],
            set_by=row["set_by"],
            set_at=row["set_at"],
            reason=row["reason"],
        )

    async def set_policy(
        self, request: PolicyRequest, actor: str, *, correlation_id: str | None = None
    ) -> PolicyView:
        """Claims follow `request`'s policy from the next claim on; the policy in force, and
        whether this changed it."""
        command = SetPolicy(request.policy, actor, request.reason, self._clock.now())
        loaded = await POLICY.load(self._store, POLICY_STREAM)
        metadata = Metadata.capture(actor, correlation_id=correlation_id)
        executed = await POLICY.execute(
            self._store, POLICY_STREAM, command, metadata, loaded=loaded
        )
        # Claims read the projection's row: once this returns, the next claim follows the
        # policy in force (this one, or the same one set before, maybe a moment ago).
        last = executed.appended.log_position if executed.appended else _last(loaded.recorded)
        if last is not None:
            await self._projections.wait_applied(SchedulingProjection.name, last)
        if executed.appended is not None:
            log.warning(
                "claim policy set by %s: %s (was %s)",
                actor,
                executed.state.describe(),
                loaded.state.describe(),
            )
        view = await self.policy()
        return view.model_copy(update={"changed": executed.appended is not None})


def _last(recorded: Sequence[RecordedEvent]) -> LogPosition | None:
    return recorded[-1].log_position if recorded else None
