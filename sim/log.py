"""Reading the recorded events a workload is made of, and nothing more: from any store's log
(the in-memory one in tests), or from Postgres in one READ ONLY transaction, where an append
would be an error and the whole read sees one snapshot."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Protocol

import asyncpg

from controlplane.database import Executor
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.records import ORIGIN, LogBatch, LogPosition, RecordedEvent
from controlplane.events.store import EventStore
from sim.recording import CATEGORIES, workload_of
from sim.workload import Workload

PAGE = 5000


class LogReader(Protocol):
    async def read_log_of(
        self, categories: Collection[str] | None, after: LogPosition, limit: int = ...
    ) -> LogBatch: ...


async def recorded_events(reader: LogReader) -> list[RecordedEvent]:
    """Every job, node and tenant event, in the log's order."""
    events: list[RecordedEvent] = []
    after = ORIGIN
    while True:
        batch = await reader.read_log_of(CATEGORIES, after, PAGE)
        events += batch.events
        if batch.read < PAGE:
            return events
        after = batch.end


class _InTransaction:
    """The store's log read on one connection (in its transaction)."""

    def __init__(self, store: EventStore, conn: Executor) -> None:
        self._store = store
        self._conn = conn

    async def read_log_of(
        self, categories: Collection[str] | None, after: LogPosition, limit: int = PAGE
    ) -> LogBatch:
        return await self._store.read_log_of(categories, after, limit, conn=self._conn)


@asynccontextmanager
async def read_only(pool: asyncpg.Pool) -> AsyncIterator[LogReader]:
    """The log as one READ ONLY, REPEATABLE READ transaction sees it."""
    store = EventStore(pool, EVENT_REGISTRY)
    async with (
        pool.acquire() as conn,
        conn.transaction(isolation="repeatable_read", readonly=True),
    ):
        yield _InTransaction(store, conn)


async def read_workload(
    pool: asyncpg.Pool, since: datetime | None, until: datetime | None
) -> Workload:
    """The workload of the jobs submitted from `since` until `until`, read from Postgres
    without writing anything."""
    async with read_only(pool) as reader:
        events = await recorded_events(reader)
    return workload_of(events, since, until)
