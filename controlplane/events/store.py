"""The Postgres event store: optimistic appends to streams and a gap-free read of the global log.

It is the `EventRecorder` production uses, and adds what only a database gives: appends inside
a caller's transaction (`conn`) and several streams appended in one statement."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence

import asyncpg

from controlplane.database import Executor
from controlplane.events.codec import SerializedAppend, decode, serialize
from controlplane.events.errors import ConcurrencyError
from controlplane.events.group_commit import GroupCommit
from controlplane.events.metadata import Metadata
from controlplane.events.records import (
    ORIGIN,
    Appended,
    LogBatch,
    LogPosition,
    RecordedEvent,
    StreamAppend,
)
from controlplane.events.types import Event, EventRegistry
from controlplane.instruments import EVENTS_APPENDED
from controlplane.queries import Q


class EventStore:
    """Appends to and reads from the `events` table.

    Every method takes an optional `conn` so that callers can append inside their own
    transaction (a claim, its GPU allocation and its event commit together); without one the
    store uses its pool, and appends requested while others are in flight are committed
    together in one statement (group commit), each still refused or accepted on its own.
    """

    def __init__(self, pool: asyncpg.Pool, types: EventRegistry) -> None:
        self._pool = pool
        self._types = types
        self._group: GroupCommit[SerializedAppend, Appended | None] = GroupCommit(
            lambda news: self._insert(self._pool, news), key=lambda new: new.stream_id
        )

    @property
    def pool(self) -> asyncpg.Pool:
        """The pool it appends with: for callers that append inside a transaction of theirs."""
        return self._pool

    async def close(self) -> None:
        """Finish the appends in flight; call before closing the pool."""
        await self._group.close()

    def on(self, conn: Executor) -> OnConnection:
        """The store's reads and appends inside `conn`'s transaction: for the command path
        (events/commands.py) where a command commits with other writes."""
        return OnConnection(self, conn)

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
        new = serialize(StreamAppend(stream_id, expected_version, events, metadata), self._types)
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
        news = [serialize(append, self._types) for append in appends]
        if len({new.stream_id for new in news}) < len(news):
            raise ValueError("append_many: a stream appears twice; append its events together")
        return await self._insert(conn, news)

    async def _insert(
        self, executor: Executor, news: Sequence[SerializedAppend]
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
        self,
        stream_id: str,
        *,
        from_version: int = 1,
        limit: int | None = None,
        conn: Executor | None = None,
    ) -> list[RecordedEvent]:
        """A stream's events in version order, from `from_version`, at most `limit` of them
        (None: all; empty for a stream that does not exist)."""
        executor = conn if conn is not None else self._pool
        rows = await executor.fetch(Q["read_stream"], stream_id, from_version, limit)
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
        # The held rows come last (see `read_log`): a reader takes the rows before them.
        readable = list(itertools.takewhile(lambda row: not row["held"], rows))
        events = [self._decode(row) for row in readable if row["wanted"]]
        end = LogPosition(readable[-1]["xid"], readable[-1]["position"]) if readable else after
        return LogBatch(events, len(readable), end, held_back=len(readable) < len(rows))

    async def log_tail(self) -> LogPosition:
        """The place of the last event readable now: where a follower of only news starts."""
        row = await self._pool.fetchrow(Q["log_tail"])
        return LogPosition(row["xid"], row["position"]) if row else ORIGIN

    def _decode(self, row: asyncpg.Record) -> RecordedEvent:
        return decode(
            self._types,
            position=row["position"],
            xid=row["xid"],
            stream_id=row["stream_id"],
            stream_version=row["stream_version"],
            type_name=row["type"],
            schema_version=row["schema_version"],
            data=row["data"],
            metadata=row["metadata"],
            recorded_at=row["recorded_at"],
        )


class OnConnection:
    """An event store's streams read and appended on one connection (in its transaction)."""

    def __init__(self, store: EventStore, conn: Executor) -> None:
        self._store = store
        self._conn = conn

    async def read_stream(self, stream_id: str, *, from_version: int = 1) -> list[RecordedEvent]:
        return await self._store.read_stream(stream_id, from_version=from_version, conn=self._conn)

    async def append(
        self, stream_id: str, expected_version: int, events: Sequence[Event], metadata: Metadata
    ) -> Appended:
        return await self._store.append(
            stream_id, expected_version, events, metadata, conn=self._conn
        )
