"""An event store in memory: the `EventRecorder` for pure tests and simulations, where a
database would only cost time. It checks, stores and decodes events as the Postgres store does
(events/codec.py), so both refuse the same input and read back the same events."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.events.codec import decode, serialize
from controlplane.events.errors import ConcurrencyError
from controlplane.events.metadata import Metadata
from controlplane.events.records import (
    ORIGIN,
    Appended,
    LogBatch,
    LogPosition,
    RecordedEvent,
    StreamAppend,
    category_of,
)
from controlplane.events.types import Event, EventRegistry


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event as kept: its place, and its type, schema version and data as written (decoded,
    and upcast, only when read, as from the table)."""

    position: int
    xid: int
    stream_id: str
    stream_version: int
    type_name: str
    schema_version: int
    data: str
    metadata: str
    recorded_at: datetime


def _log_position(stored: StoredEvent) -> LogPosition:
    return LogPosition(stored.xid, stored.position)


class InMemoryEventStore:
    """Streams and the global log in lists.

    Each append is one "transaction" with an xid of its own, so log positions are ordered as
    in Postgres. An append has no await between its version check and its write, so appends
    from tasks of one event loop are serialized, as the database's locks serialize them.
    """

    def __init__(self, types: EventRegistry, clock: Clock = SYSTEM_CLOCK) -> None:
        self._types = types
        self._clock = clock
        self._log: list[StoredEvent] = []
        self._streams: dict[str, list[StoredEvent]] = {}

    async def append(
        self, stream_id: str, expected_version: int, events: Sequence[Event], metadata: Metadata
    ) -> Appended:
        new = serialize(StreamAppend(stream_id, expected_version, events, metadata), self._types)
        stream = self._streams.setdefault(stream_id, [])
        if len(stream) != expected_version:
            raise ConcurrencyError(stream_id, expected_version, len(stream))
        xid = self._log[-1].xid + 1 if self._log else 1
        recorded_at = self._clock.now()
        written = [
            StoredEvent(
                position=len(self._log) + offset,
                xid=xid,
                stream_id=stream_id,
                stream_version=expected_version + offset,
                type_name=name,
                schema_version=schema_version,
                data=data,
                metadata=new.metadata,
                recorded_at=recorded_at,
            )
            for offset, (name, schema_version, data) in enumerate(
                zip(new.types, new.schema_versions, new.datas, strict=True), start=1
            )
        ]
        self._log.extend(written)
        stream.extend(written)
        return Appended(
            stream_id,
            written[-1].stream_version,
            tuple(stored.position for stored in written),
            xid,
            recorded_at,
        )

    async def read_stream(
        self, stream_id: str, *, from_version: int = 1, limit: int | None = None
    ) -> list[RecordedEvent]:
        stream = self._streams.get(stream_id, [])[max(from_version, 1) - 1 :]
        return [self._decode(stored) for stored in stream[:limit]]

    async def version(self, stream_id: str) -> int:
        return len(self._streams.get(stream_id, []))

    async def read_log(self, after: LogPosition, limit: int = 1000) -> list[RecordedEvent]:
        return (await self.read_log_of(None, after, limit)).events

    async def read_log_of(
        self, categories: Collection[str] | None, after: LogPosition, limit: int = 1000
    ) -> LogBatch:
        start = bisect_right(self._log, after, key=_log_position)
        read = self._log[start : start + limit]
        events = [
            self._decode(stored)
            for stored in read
            if categories is None or category_of(stored.stream_id) in categories
        ]
        end = _log_position(read[-1]) if read else after
        return LogBatch(events, len(read), end)

    async def log_tail(self) -> LogPosition:
        return _log_position(self._log[-1]) if self._log else ORIGIN

    def _decode(self, stored: StoredEvent) -> RecordedEvent:
        return decode(
            self._types,
            position=stored.position,
            xid=stored.xid,
            stream_id=stored.stream_id,
            stream_version=stored.stream_version,
            type_name=stored.type_name,
            schema_version=stored.schema_version,
            data=stored.data,
            metadata=stored.metadata,
            recorded_at=stored.recorded_at,
        )

    async def close(self) -> None:
        """Nothing is ever in flight."""
