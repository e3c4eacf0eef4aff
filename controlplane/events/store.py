"""The event store: optimistic appends to streams and a gap-free read of the global log."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

import asyncpg

from controlplane.database import Executor
from controlplane.events.errors import ConcurrencyError, MalformedEvent, UnknownEventType
from controlplane.events.group_commit import GroupCommit
from controlplane.events.metadata import Metadata
from controlplane.events.types import Event, EventRegistry, registry
from controlplane.instruments import EVENTS_APPENDED
from controlplane.queries import Q

STREAM_ID = re.compile(r"^[a-z][a-z0-9_]*-[A-Za-z0-9._:@-]+$")
"""`<category>-<id>`, e.g. `job-<uuid>`, `node-gpu01`, `tenant-acme`; the table checks it too."""


class LogPosition(NamedTuple):
    """A reader's place in the global log: the (xid, position) of the last event it read."""

    xid: int
    position: int


ORIGIN = LogPosition(0, 0)
"""Before the first event."""


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An event as stored: where it sits in its stream and in the global log, and when."""

    position: int
    xid: int
    stream_id: str
    stream_version: int
    event: Event
    metadata: Metadata
    recorded_at: datetime

    @property
    def log_position(self) -> LogPosition:
        return LogPosition(self.xid, self.position)

    @property
    def category(self) -> str:
        return self.stream_id.partition("-")[0]


@dataclass(frozen=True, slots=True)
class Appended:
    """The outcome of an append: the stream's new version and the events' global positions."""

    stream_id: str
    version: int
    positions: tuple[int, ...]
    xid: int
    recorded_at: datetime

    @property
    def log_position(self) -> LogPosition:
        """The place of the last appended event in the global log."""
        return LogPosition(self.xid, self.positions[-1])


@dataclass(frozen=True, slots=True)
class LogBatch:
    """What one read of the log returned: the wanted events, how many it read in all, and the
    place of the last one read (`after` when it read none)."""

    events: list[RecordedEvent]
    read: int
    end: LogPosition


@dataclass(frozen=True, slots=True)
class StreamAppend:
    """Events for one stream, to be appended only if it is at `expected_version`."""

    stream_id: str
    expected_version: int
    events: Sequence[Event]
    metadata: Metadata


@dataclass(frozen=True, slots=True)
class _Serialized:
    """A checked append, its events and metadata as JSON."""

    stream_id: str
    expected_version: int
    types: list[str]
    schema_versions: list[int]
    datas: list[str]
    metadata: str


class EventStore:
    """Appends to and reads from the `events` table.

    Every method takes an optional `conn` so that callers can append inside their own
    transaction (a claim, its GPU allocation and its event commit together); without one the
    store uses its pool, and appends requested while others are in flight are committed
    together in one statement (group commit), each still refused or accepted on its own.
    """

    def __init__(self, pool: asyncpg.Pool, types: EventRegistry = registry) -> None:
        self._pool = pool
        self._types = types
        self._group: GroupCommit[_Serialized, Appended | None] = GroupCommit(
            lambda news: self._insert(self._pool, news), key=lambda new: new.stream_id
        )

    @property
    def pool(self) -> asyncpg.Pool:
        """The pool it appends with: for callers that append inside a transaction of theirs."""
        return self._pool

    async def close(self) -> None:
        """Finish the appends in flight; call before closing the pool."""
        await self._group.close()

    async def append(
        self,
        stream_id: str,
        expected_version: int,
        events: Sequence[Event],
        metadata: Metadata,
        *,
        conn: Executor | None = None,
    ) -> Appended:
        """Append `events` to a stream at `expected_version` (0: the stream must be new).

        Raises ConcurrencyError, writing nothing, when the stream is at another version.
        Without `conn`, appends made while others are in flight are committed together.
        """
        new = self._prepare(StreamAppend(stream_id, expected_version, events, metadata))
        if conn is None:
            appended = await self._group.submit(new)
        else:
            [appended] = await self._insert(conn, [new])
        if appended is None:
            raise await self._conflict(conn or self._pool, stream_id, expected_version, conn)
        return appended

    async def append_many(
        self, appends: Sequence[StreamAppend], *, conn: Executor
    ) -> list[Appended | None]:
        """Append to several streams in one statement inside the caller's transaction: for
        each, what was appended, or None where its stream was not at the expected version
        (nothing of that one was written; the others were)."""
        news = [self._prepare(append) for append in appends]
        if len({new.stream_id for new in news}) < len(news):
            raise ValueError("append_many: a stream appears twice; append its events together")
        return await self._insert(conn, news)

    def _prepare(self, append: StreamAppend) -> _Serialized:
        stream_id, expected_version = append.stream_id, append.expected_version
        if not STREAM_ID.match(stream_id):
            raise ValueError(f"invalid stream id {stream_id!r}: expected '<category>-<id>'")
        if expected_version < 0:
            raise ValueError(f"stream {stream_id}: expected version must be >= 0")
        if not append.events:
            raise ValueError(f"stream {stream_id}: nothing to append")
        names, versions, datas = [], [], []
        for offset, event in enumerate(append.events, start=1):
            version = expected_version + offset
            if not self._types.is_registered(event):
                raise UnknownEventType(
                    f"stream {stream_id} version {version}: event class "
                    f"{type(event).__name__} is not a registered event type; nothing was written"
                )
            try:
                datas.append(event.model_dump_json())
            except ValueError as exc:
                raise MalformedEvent(
                    f"stream {stream_id} version {version}: {event.type_name} cannot be "
                    f"serialized ({exc}); nothing was written"
                ) from exc
            names.append(event.type_name)
            versions.append(event.schema_version)
        return _Serialized(
            stream_id, expected_version, names, versions, datas, append.metadata.model_dump_json()
        )

    async def _insert(
        self, executor: Executor, news: Sequence[_Serialized]
    ) -> list[Appended | None]:
        ks, ords, names, versions, datas = [], [], [], [], []
        for k, new in enumerate(news, start=1):
            for ord_, (name, version, data) in enumerate(
                zip(new.types, new.schema_versions, new.datas, strict=True), start=1
            ):
                ks.append(k)
                ords.append(ord_)
                names.append(name)
                versions.append(version)
                datas.append(data)
        try:
            rows = await executor.fetch(
                Q["append_events"],
                [new.stream_id for new in news],
                [new.expected_version for new in news],
                [new.metadata for new in news],
                ks,
                ords,
                names,
                versions,
                datas,
            )
        except asyncpg.UniqueViolationError as exc:
            # A concurrent append took a next version between our check and our insert.
            stream_id = news[0].stream_id if len(news) == 1 else "(one of several)"
            raise ConcurrencyError(
                stream_id,
                news[0].expected_version,
                -1,
                "another append took that version concurrently",
            ) from exc
        by_stream = {row["stream_id"]: row for row in rows}
        results: list[Appended | None] = []
        for new in news:
            row = by_stream.get(new.stream_id)
            if row is None:
                results.append(None)
                continue
            # Counted when appended: one in a caller's transaction that rolls back still counts.
            for name in new.types:
                EVENTS_APPENDED.add(1, {"type": name})
            results.append(
                Appended(
                    new.stream_id,
                    new.expected_version + len(new.types),
                    tuple(row["positions"]),
                    row["xid"],
                    row["recorded_at"],
                )
            )
        return results

    async def _conflict(
        self,
        executor: Executor,
        stream_id: str,
        expected_version: int,
        conn: Executor | None,
    ) -> ConcurrencyError:
        head = await executor.fetchrow(Q["stream_head"], stream_id)
        actual = head["stream_version"] if head else 0
        # "Younger" compares with the caller's transaction, so it means something only when
        # the append ran in one (`conn`); on the pool, this query runs on another connection.
        if conn is not None and head is not None and actual == expected_version and head["younger"]:
            # Appending would put this stream's new event before its head in (xid, position)
            # order; the caller's transaction started earlier than the head's and must retry.
            return ConcurrencyError(
                stream_id,
                expected_version,
                actual,
                "its head was appended by a younger transaction; retry in a new transaction",
            )
        return ConcurrencyError(stream_id, expected_version, actual)

    async def read_stream(
        self, stream_id: str, *, from_version: int = 1, conn: Executor | None = None
    ) -> list[RecordedEvent]:
        """A stream's events in version order (empty for a stream that does not exist)."""
        executor = conn if conn is not None else self._pool
        rows = await executor.fetch(Q["read_stream"], stream_id, from_version)
        return [self._decode(row) for row in rows]

    async def version(self, stream_id: str, *, conn: Executor | None = None) -> int:
        """The stream's current version (0 for a stream that does not exist)."""
        executor = conn if conn is not None else self._pool
        return int(await executor.fetchval(Q["stream_version"], stream_id))

    async def read_log(
        self, after: LogPosition, limit: int = 1000, *, conn: Executor | None = None
    ) -> list[RecordedEvent]:
        """Up to `limit` events after `after`, in the one global order every reader sees.

        Gap-free: an event still being written by an open transaction is held back, together
        with everything after it, until that transaction ends.
        """
        return (await self.read_log_of(None, after, limit, conn=conn)).events

    async def read_log_of(
        self,
        categories: Collection[str] | None,
        after: LogPosition,
        limit: int = 1000,
        *,
        conn: Executor | None = None,
    ) -> LogBatch:
        """Like `read_log`, but only the events of streams in `categories` (None: all) are
        decoded and returned; the batch also says where reading stopped, so that a reader
        (a projection) moves past the others without paying to decode them."""
        executor = conn if conn is not None else self._pool
        wanted = None if categories is None else list(categories)
        rows = await executor.fetch(Q["read_log"], str(after.xid), after.position, limit, wanted)
        events = [self._decode(row) for row in rows if row["wanted"]]
        end = LogPosition(rows[-1]["xid"], rows[-1]["position"]) if rows else after
        return LogBatch(events, len(rows), end)

    async def has_more(self, after: LogPosition, *, conn: Executor | None = None) -> bool:
        """Whether `read_log(after)` would return anything now."""
        executor = conn if conn is not None else self._pool
        return bool(await executor.fetchval(Q["log_has_more"], str(after.xid), after.position))

    async def log_tail(self) -> LogPosition:
        """The place of the last event readable now: where a follower of only news starts."""
        row = await self._pool.fetchrow(Q["log_tail"])
        return LogPosition(row["xid"], row["position"]) if row else ORIGIN

    def _decode(self, row: asyncpg.Record) -> RecordedEvent:
        try:
            event = self._types.decode(row["type"], row["schema_version"], row["data"])
        except (UnknownEventType, MalformedEvent) as exc:
            raise type(exc)(
                f"stream {row['stream_id']} version {row['stream_version']} "
                f"(position {row['position']}): {exc}"
            ) from exc
        return RecordedEvent(
            position=row["position"],
            xid=row["xid"],
            stream_id=row["stream_id"],
            stream_version=row["stream_version"],
            event=event,
            metadata=Metadata.model_validate_json(row["metadata"]),
            recorded_at=row["recorded_at"],
        )
