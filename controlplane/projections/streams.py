"""The `streams` read model: every stream, its category, version and last change."""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.database import Executor
from controlplane.events.store import RecordedEvent
from controlplane.queries import Q


class StreamsProjection:
    name = "streams"
    tables: Sequence[str] = ("streams",)

    async def apply(self, conn: Executor, event: RecordedEvent) -> None:
        await conn.execute(
            Q["upsert_stream"],
            event.stream_id,
            event.category,
            event.stream_version,
            event.event.type_name,
            event.position,
            event.recorded_at,
        )
