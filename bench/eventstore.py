"""`trainyard bench eventstore`: append throughput against two references measured in one run.

- raw: the same writers doing plain single-row INSERT + COMMIT with asyncpg into a table of the
  same shape as `events` (no version check, no notify, no trigger): the ceiling of one commit
  per event. The store's appends from concurrent writers share statements and commits (group
  commit), so they can pass it: that is the point of group commit.
- peer: the `eventsourcing` library's PostgreSQL application recorder (psycopg, one thread per
  writer) appending the same events to the same database: what a team would otherwise use.
  It is in the `bench` extra; without it, the peer's fields are null.

Everything runs in a scratch database on the configured server, dropped at the end.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench.scratch import scratch_database
from controlplane.database import connect, create_pool
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.types import Event, EventRegistry, event_type

WRITERS = 8
BATCH = 100


@event_type("bench.Tick")
class Tick(Event):
    """A small event shaped like a training progress report."""

    step: int
    loss: float
    note: str


TICKS = EventRegistry((Tick,))
"""The only events this benchmark writes."""


def _tick(step: int) -> Tick:
    return Tick(step=step, loss=1.0 / (step + 1), note="epoch progress")


async def run(url: str, *, seconds: float, progress: bool = False) -> dict[str, Any]:
    async with scratch_database(url, "eventstore") as scratch:
        return await _measure(scratch, seconds, progress)


async def _measure(url: str, seconds: float, progress: bool) -> dict[str, Any]:
    owner = await connect(url, role=None)
    try:
        # Same columns, defaults, constraints and indexes as `events`; no triggers.
        await owner.execute(
            "CREATE TABLE bench_raw (LIKE events INCLUDING ALL);"
            "GRANT SELECT, INSERT ON bench_raw TO trainyard_app"
        )
    finally:
        await owner.close()

    def say(what: str) -> None:
        if progress:
            print(f"measuring {what} for {seconds:g}s ...", file=sys.stderr)

    metadata = Metadata(actor="bench", tenant="bench")
    pool = await create_pool(url, min_size=WRITERS + 1, max_size=WRITERS + 1)
    try:
        store = EventStore(pool, TICKS)
        say("raw inserts and appends, interleaved")
        # Alternating halves, so that drift in the machine's load hits both alike.
        raw = single = 0.0
        for _ in range(2):
            raw += await _concurrently(seconds / 2, _raw_writer(pool, metadata)) / 2
            single += await _concurrently(seconds / 2, _append_writer(store, metadata, 1)) / 2
        say(f"appends of {BATCH}")
        batch = await _concurrently(seconds, _append_writer(store, metadata, BATCH))
        await store.close()
    finally:
        await pool.close()
    ours = {
        "writers": WRITERS,
        "seconds": seconds,
        "append_events_per_s": round(single),
        "raw_insert_per_s": round(raw),
        "ratio_vs_raw": round(single / raw, 3),
        "batch_size": BATCH,
        "batch_append_events_per_s": round(batch),
    }
    if importlib.util.find_spec("eventsourcing") is None:
        if progress:
            print(
                "the eventsourcing recorder left out (install the `bench` extra)", file=sys.stderr
            )
        return {**ours, "peer": None, "peer_events_per_s": None, "ratio_vs_peer": None}
    say("the eventsourcing recorder")
    peer = await asyncio.to_thread(_peer, url, seconds, metadata)
    return {
        **ours,
        "peer": "eventsourcing PostgresApplicationRecorder",
        "peer_events_per_s": round(peer),
        "ratio_vs_peer": round(single / peer, 3),
    }


Writer = Callable[[], Awaitable[int]]


async def _concurrently(seconds: float, make_writer: Callable[[], Writer]) -> float:
    """Events per second of WRITERS concurrent writers, each looping until the deadline."""
    deadline = time.perf_counter() + seconds
    counts = [0] * WRITERS

    async def loop(index: int) -> None:
        write = make_writer()
        while time.perf_counter() < deadline:
            counts[index] += await write()

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for index in range(WRITERS):
            group.create_task(loop(index))
    return sum(counts) / (time.perf_counter() - start)


def _raw_writer(pool: asyncpg.Pool, metadata: Metadata) -> Callable[[], Writer]:
    meta = metadata.model_dump_json()

    def make() -> Writer:
        stream = f"job-{uuid.uuid4()}"
        version = 0

        async def write() -> int:
            nonlocal version
            version += 1
            await pool.execute(
                "INSERT INTO bench_raw (stream_id, stream_version, type, schema_version, data,"
                " metadata) VALUES ($1, $2, $3, $4, $5, $6)",
                stream,
                version,
                Tick.type_name,
                Tick.schema_version,
                _tick(version).model_dump_json(),
                meta,
            )
            return 1

        return write

    return make


def _append_writer(store: EventStore, metadata: Metadata, size: int) -> Callable[[], Writer]:
    def make() -> Writer:
        stream = f"job-{uuid.uuid4()}"
        version = 0

        async def write() -> int:
            nonlocal version
            events = [_tick(version + i) for i in range(size)]
            appended = await store.append(stream, version, events, metadata)
            version = appended.version
            return size

        return write

    return make


def _peer(url: str, seconds: float, metadata: Metadata) -> float:
    """The eventsourcing recorder, one thread per writer, one event per transaction."""
    from eventsourcing.persistence import StoredEvent
    from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(url)
    datastore = PostgresDatastore(
        dbname=str(info["dbname"]),
        host=str(info.get("host", "")),
        port=str(info.get("port", "5432")),
        user=str(info.get("user", "")),
        password=str(info.get("password", "")),
        pool_size=WRITERS,
    )
    try:
        recorder = PostgresApplicationRecorder(datastore, events_table_name="bench_peer_events")
        recorder.create_table()
        meta = metadata.model_dump_json()
        deadline = time.perf_counter() + seconds
        counts = [0] * WRITERS

        def loop(index: int) -> None:
            originator = uuid.uuid4()
            version = 0
            while time.perf_counter() < deadline:
                version += 1
                state = (_tick(version).model_dump_json() + meta).encode()
                recorder.insert_events([StoredEvent(originator, version, Tick.type_name, state)])
                counts[index] += 1

        threads = [threading.Thread(target=loop, args=(i,)) for i in range(WRITERS)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(counts) / (time.perf_counter() - start)
    finally:
        datastore.close()
