"""The `streams` read model: every stream, its category, version and last change."""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.database import Executor
from controlplane.events.records import RecordedEvent
from controlplane.queries import Q


class StreamsProjection:
    name = "streams"
    tables: Sequence[str] = ("streams",)
    categories: frozenset[str] | None = None

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        # Each stream once: its first event in the batch (where a new stream begins) and its
        # last (where it now stands); the log order keeps both right.
        first: dict[str, RecordedEvent] = {}
        last: dict[str, RecordedEvent] = {}
        for event in events:
            first.setdefault(event.stream_id, event)
            last[event.stream_id] = event
        await conn.execute(
            Q["upsert_streams"],
            list(last),
            [e.category for e in last.values()],
            [e.stream_version for e in last.values()],
            [e.event.type_name for e in last.values()],
            [first[s].position for s in last],
            [e.position for e in last.values()],
            [first[s].recorded_at for s in last],
            [e.recorded_at for e in last.values()],
        )
