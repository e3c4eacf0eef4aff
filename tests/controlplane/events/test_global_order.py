"""The global log is gap-free: a reader never skips an event whose transaction commits late,
never sees one twice, and every reader sees the same order."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import asyncpg

from controlplane.events.metadata import Metadata
from controlplane.events.records import ORIGIN, LogPosition
from controlplane.events.store import EventStore
from tests.events import Pinged, holding_an_xid
from tests.polling import eventually

META = Metadata(actor="test")


class Rollback(Exception):
    pass


async def appender(
    index: int, pool: asyncpg.Pool, store: EventStore, committed: list[int], rng: random.Random
) -> None:
    stream = f"job-{index}"
    version = 0
    for _ in range(12):
        size = rng.randint(1, 3)
        kind = rng.choices(["quick", "held", "rollback"], weights=[5, 3, 2])[0]
        async with pool.acquire() as conn:
            try:
                async with conn.transaction():
                    appended = await store.append(
                        stream,
                        version,
                        [Pinged(n=version + i) for i in range(size)],
                        META,
                        conn=conn,
                    )
                    if kind == "held":
                        # Holds a low position while younger transactions commit higher ones.
                        await asyncio.sleep(rng.uniform(0.05, 0.4))
                    if kind == "rollback":
                        raise Rollback
            except Rollback:
                continue
        committed.extend(appended.positions)
        version = appended.version
        await asyncio.sleep(rng.uniform(0, 0.02))


async def subscriber(store: EventStore, done: asyncio.Event, seen: list[int]) -> None:
    position = ORIGIN
    while True:
        finished = done.is_set()  # read before the batch: everything committed by now counts
        batch = await store.read_log(position, limit=7)
        for event in batch:
            seen.append(event.position)
            position = event.log_position
        if not batch:
            if finished:
                return
            await asyncio.sleep(0.005)


async def naive_subscriber(pool: asyncpg.Pool, done: asyncio.Event, seen: list[int]) -> None:
    """The plain `position > last` reader, to show the scenario does skip events for it."""
    last = 0
    while True:
        finished = done.is_set()
        rows = await pool.fetch(
            "SELECT position FROM events WHERE position > $1 ORDER BY position LIMIT 7", last
        )
        seen.extend(row["position"] for row in rows)
        last = rows[-1]["position"] if rows else last
        if not rows:
            if finished:
                return
            await asyncio.sleep(0.005)


async def test_concurrent_writers_late_commits_and_rollbacks(
    pool: asyncpg.Pool, store: EventStore
) -> None:
    rng = random.Random(20261122)
    committed: list[int] = []
    done = asyncio.Event()
    views: list[list[int]] = [[] for _ in range(3)]
    naive: list[int] = []
    readers = [asyncio.create_task(subscriber(store, done, view)) for view in views]
    readers.append(asyncio.create_task(naive_subscriber(pool, done, naive)))
    async with asyncio.TaskGroup() as group:
        for index in range(12):
            group.create_task(appender(index, pool, store, committed, random.Random(rng.random())))
    done.set()
    await asyncio.gather(*readers)

    assert len(committed) > 100
    for view in views:
        assert len(view) == len(set(view)), "an event was delivered twice"
        assert set(view) == set(committed), "a committed event was skipped (or a phantom seen)"
        assert view == views[0], "readers disagree on the order"
    # Held-open transactions committed low positions after higher ones had been read.
    assert set(naive) < set(committed), "the scenario skipped nothing for a naive reader"

    # A late reader, starting from the beginning, sees the very same order.
    replay: list[int] = []
    position: LogPosition = ORIGIN
    while batch := await store.read_log(position, limit=50):
        replay.extend(e.position for e in batch)
        position = batch[-1].log_position
    assert replay == views[0]


async def test_an_open_transaction_holds_back_everything_after_it(
    pool: asyncpg.Pool, store: EventStore
) -> None:
    async with pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        early = await store.append("job-early", 0, [Pinged(n=1)], META, conn=conn)
        later = await store.append("job-later", 0, [Pinged(n=2)], META)
        assert later.positions[0] > early.positions[0]
        assert await store.read_log(ORIGIN) == []  # the later commit waits behind the open one
        await transaction.commit()
    positions = [e.position for e in await store.read_log(ORIGIN)]
    assert positions == [early.positions[0], later.positions[0]]


async def test_a_read_says_when_news_waits_for_an_older_transaction_that_appends_nothing(
    pool: asyncpg.Pool, store: EventStore
) -> None:
    async with holding_an_xid(pool):
        later = await store.append("job-later", 0, [Pinged(n=1)], META)
        held = await store.read_log_of(None, ORIGIN)
        assert (held.events, held.read, held.end, held.held_back) == ([], 0, ORIGIN, True)
    # The bound is the whole server's: another database's transaction may hold it a moment.
    await eventually(lambda: _readable(store, later.positions))


async def _readable(store: EventStore, positions: Sequence[int]) -> bool:
    batch = await store.read_log_of(None, ORIGIN)
    return [e.position for e in batch.events] == list(positions) and not batch.held_back
