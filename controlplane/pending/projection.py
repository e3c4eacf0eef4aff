"""The `pending` projection: `pending_spans`, every span of time a reason held a queued job
back, from the jobs' pending streams. A change ends the spans of the reasons that no longer
hold and begins those of the new ones; the reasons that go on keep their span."""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.database import Executor
from controlplane.events.records import RecordedEvent
from controlplane.pending.events import PendingReasonsChanged
from controlplane.pending.streams import CATEGORY, job_id_of
from controlplane.queries import Q


class PendingProjection:
    name = "pending"
    tables: Sequence[str] = ("pending_spans",)
    categories: frozenset[str] | None = frozenset({CATEGORY})

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        for recorded in events:
            event = recorded.event
            if not isinstance(event, PendingReasonsChanged):
                continue
            job_id = job_id_of(recorded.stream_id)
            kinds = [r.reason.value for r in event.reasons]
            await conn.execute(Q["pending_close_spans"], job_id, event.at, kinds, event.attempt)
            if event.reasons:
                await conn.execute(
                    Q["pending_open_spans"],
                    job_id,
                    event.at,
                    event.attempt,
                    kinds,
                    [r.blocking.value for r in event.reasons],
                    [r.detail for r in event.reasons],
                )
