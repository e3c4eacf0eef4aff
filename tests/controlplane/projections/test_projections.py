"""The projection runner: exactly-once with its checkpoint, LISTEN/NOTIFY with polling, recovery
of a dropped listening connection, and rebuilds that equal the incremental build."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import asyncpg
import pytest

from controlplane.database import Executor
from controlplane.events.metadata import Metadata
from controlplane.events.records import ORIGIN, RecordedEvent
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.projections.runner import BatchFailed, ProjectionRunner
from controlplane.projections.streams import StreamsProjection
from tests.events import Pinged, holding_an_xid
from tests.polling import eventually

META = Metadata(actor="test")
SNAPSHOT = "SELECT * FROM streams ORDER BY stream_id"


@contextlib.asynccontextmanager
async def running(runner: ProjectionRunner, listener: LogListener) -> AsyncIterator[None]:
    task = asyncio.create_task(runner.run())
    try:
        yield
    finally:
        runner.stop()
        listener.wake()
        await asyncio.wait_for(task, 5)


def runner_for(pool: asyncpg.Pool, store: EventStore, listener: LogListener) -> ProjectionRunner:
    return ProjectionRunner(pool, store, listener, [StreamsProjection()], batch_size=10)


async def all_readable(store: EventStore, count: int) -> None:
    """Wait until `count` events are readable: the log's bound is cluster-wide, so a
    transaction open in another database of the server may hold new events back a moment."""

    async def readable() -> bool:
        return len(await store.read_log(ORIGIN, limit=count + 1)) == count

    await eventually(readable)


async def append_some(store: EventStore, streams: int, each: int, start: int = 0) -> None:
    for s in range(streams):
        for v in range(start, start + each):
            await store.append(f"job-{s}", v, [Pinged(n=v)], META)


async def test_runner_builds_the_read_model_and_its_checkpoint(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener, owner: asyncpg.Connection
) -> None:
    await append_some(store, streams=3, each=7)
    await all_readable(store, 21)
    runner = runner_for(pool, store, listener)
    assert not await runner.caught_up()
    assert await runner.catch_up(runner.projections["streams"]) == 21
    assert await runner.caught_up()
    rows = await owner.fetch(SNAPSHOT)
    assert [(r["stream_id"], r["category"], r["version"]) for r in rows] == [
        ("job-0", "job", 7),
        ("job-1", "job", 7),
        ("job-2", "job", 7),
    ]
    checkpoint = await owner.fetchrow("SELECT position FROM projection_checkpoints")
    assert checkpoint is not None
    assert checkpoint["position"] == max(r["last_position"] for r in rows)
    assert await runner.catch_up(runner.projections["streams"]) == 0  # nothing twice


class Exploding:
    """Writes a row per event, and fails on the n-th event of its first batch."""

    name = "exploding"
    tables = ("exploding",)
    categories: frozenset[str] | None = None

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        for event in events:
            await conn.execute("INSERT INTO exploding VALUES ($1)", event.position)
            if event.position == self.fail_at:
                raise RuntimeError("projection bug")


async def test_a_failed_batch_leaves_neither_rows_nor_checkpoint(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener, owner: asyncpg.Connection
) -> None:
    await owner.execute("CREATE TABLE exploding (position bigint PRIMARY KEY)")
    await owner.execute("GRANT SELECT, INSERT, TRUNCATE ON exploding TO trainyard_app")
    await append_some(store, streams=1, each=5)
    await all_readable(store, 5)
    projection = Exploding(fail_at=3)
    runner = ProjectionRunner(pool, store, listener, [projection], batch_size=10)
    with pytest.raises(BatchFailed) as failed:
        await runner.catch_up(projection)
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert await owner.fetchval("SELECT count(*) FROM exploding") == 0
    assert await owner.fetchval("SELECT count(*) FROM projection_checkpoints") == 0
    projection.fail_at = -1
    assert await runner.catch_up(projection) == 5
    assert await owner.fetchval("SELECT count(*) FROM exploding") == 5


async def test_a_projection_failing_on_one_event_stops_there_and_the_others_go_on(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener, owner: asyncpg.Connection
) -> None:
    await owner.execute("CREATE TABLE exploding (position bigint PRIMARY KEY)")
    await owner.execute("GRANT SELECT, INSERT, TRUNCATE ON exploding TO trainyard_app")
    await append_some(store, streams=1, each=5)
    await all_readable(store, 5)
    poison = await owner.fetchval("SELECT position FROM events ORDER BY position OFFSET 2 LIMIT 1")
    exploding = Exploding(fail_at=poison)
    runner = ProjectionRunner(
        pool, store, listener, [exploding, StreamsProjection()], batch_size=10, max_failures=2
    )
    async with running(runner, listener):

        async def stopped() -> bool:
            listener.wake()  # a round now, not at the next poll
            return "exploding" in runner.stopped()

        await eventually(stopped)
        why = runner.stopped()["exploding"]
        assert f"position {poison} (test.Pinged, stream job-0 version 3)" in why
        assert "2 times in a row" in why
        # The batch was narrowed to the failing event: those before it are applied.
        assert await owner.fetchval("SELECT count(*) FROM exploding") == 2
        assert await runner.is_caught_up("streams")


async def test_two_runners_apply_every_event_exactly_once(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener, owner: asyncpg.Connection
) -> None:
    await owner.execute("CREATE TABLE exploding (position bigint PRIMARY KEY)")
    await owner.execute("GRANT SELECT, INSERT, TRUNCATE ON exploding TO trainyard_app")
    writer = asyncio.create_task(append_some(store, streams=4, each=25))
    projection = Exploding(fail_at=-1)
    runners = [
        ProjectionRunner(pool, store, listener, [projection], batch_size=3) for _ in range(2)
    ]
    while not writer.done():
        # A duplicate would violate the primary key and fail the batch loudly.
        await asyncio.gather(*(r.catch_up(projection) for r in runners))
    await writer
    await all_readable(store, 100)
    await runners[0].catch_up(projection)
    assert await owner.fetchval("SELECT count(*) FROM exploding") == 100


async def test_notify_wakes_the_running_runner(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener, owner: asyncpg.Connection
) -> None:
    runner = runner_for(pool, store, listener)
    async with running(runner, listener):
        await store.append("job-x", 0, [Pinged(n=1)], META)

        async def projected() -> bool:
            return bool(await owner.fetchval("SELECT count(*) FROM streams"))

        await eventually(projected)  # well before the 60 s poll


async def test_news_held_back_by_a_transaction_that_notifies_no_one_is_applied_when_it_ends(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener, owner: asyncpg.Connection
) -> None:
    runner = runner_for(pool, store, listener)
    async with running(runner, listener):
        # The append's NOTIFY wakes the runner while the event is held back, and the end of
        # what holds it wakes no one.
        async with holding_an_xid(pool):
            seen = listener.generation
            await store.append("job-x", 0, [Pinged(n=1)], META)
            await listener.wait(seen)
            await asyncio.sleep(0.2)  # the round the NOTIFY woke reads, and finds it held back
            assert not await owner.fetchval("SELECT count(*) FROM streams")

        async def projected() -> bool:
            return bool(await owner.fetchval("SELECT count(*) FROM streams"))

        await eventually(projected)  # well before the 60 s poll


async def test_a_dropped_listen_connection_is_re_established_and_caught_up(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener, owner: asyncpg.Connection
) -> None:
    runner = runner_for(pool, store, listener)
    async with running(runner, listener):
        first = listener.connection
        assert first is not None
        pid = first.get_server_pid()
        assert await owner.fetchval("SELECT pg_terminate_backend($1)", pid)
        # Appended while nobody listens: no NOTIFY reaches the runner for these.
        await append_some(store, streams=2, each=3)

        async def reconnected_and_projected() -> bool:
            again = listener.connection
            rows = await owner.fetchval("SELECT coalesce(sum(version), 0) FROM streams")
            return again is not None and again is not first and rows == 6

        await eventually(reconnected_and_projected)
        assert listener.connection is not None
        assert listener.connection.get_server_pid() != pid
        # And notifications flow again on the new connection.
        await store.append("job-new", 0, [Pinged(n=1)], META)

        async def projected() -> bool:
            return bool(await owner.fetchval("SELECT 1 FROM streams WHERE stream_id = 'job-new'"))

        await eventually(projected)


async def test_rebuild_equals_the_incremental_build(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener, owner: asyncpg.Connection
) -> None:
    runner = runner_for(pool, store, listener)
    projection = runner.projections["streams"]
    for round_ in range(3):  # built incrementally, in several catch-ups between appends
        await append_some(store, streams=3, each=4, start=4 * round_)
        await all_readable(store, 12 * (round_ + 1))
        await runner.catch_up(projection)
    incremental = [dict(r) for r in await owner.fetch(SNAPSHOT)]
    checkpoint = await owner.fetchrow("SELECT xid, position FROM projection_checkpoints")
    assert await runner.rebuild("streams") == 36
    assert [dict(r) for r in await owner.fetch(SNAPSHOT)] == incremental
    assert await owner.fetchrow("SELECT xid, position FROM projection_checkpoints") == checkpoint


class Collecting:
    """Keeps what it is given, of the `node` streams only."""

    name = "collecting"
    tables: Sequence[str] = ()
    categories: frozenset[str] | None = frozenset({"node"})

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.commits: set[str] = set()
        """How the transactions it applied batches in commit (`synchronous_commit`)."""

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        self.seen += [f"{e.stream_id}@{e.stream_version}" for e in events]
        self.commits.add(await conn.fetchval("SHOW synchronous_commit"))


async def test_a_projection_gets_only_its_categories_and_moves_past_the_rest(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener, owner: asyncpg.Connection
) -> None:
    for v in range(4):
        await store.append("job-1", v, [Pinged(n=v)], META)
        await store.append("node-a", v, [Pinged(n=v)], META)
    await store.append("job-2", 0, [Pinged(n=9)], META)
    await all_readable(store, 9)
    projection = Collecting()
    runner = ProjectionRunner(pool, store, listener, [projection], batch_size=3)
    # Counted as read, all nine: batches of three, the last with no event of its own.
    assert await runner.catch_up(projection) == 9
    assert projection.seen == [f"node-a@{v}" for v in range(1, 5)]
    checkpoint = await owner.fetchval("SELECT position FROM projection_checkpoints")
    assert checkpoint == await owner.fetchval("SELECT max(position) FROM events")
    assert await runner.is_caught_up("collecting")
    assert await runner.catch_up(projection) == 0


async def test_projections_at_different_places_share_rounds_and_apply_their_events_once(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener, owner: asyncpg.Connection
) -> None:
    for v in range(3):
        await store.append("node-a", v, [Pinged(n=v)], META)
    await all_readable(store, 3)
    collecting = Collecting()
    runner = ProjectionRunner(
        pool, store, listener, [StreamsProjection(), collecting], batch_size=2
    )
    await runner.catch_up(collecting)  # ahead of `streams`, which has applied nothing
    for v in range(3):
        await store.append("node-a", 3 + v, [Pinged(n=v)], META)
        await store.append("job-1", v, [Pinged(n=v)], META)  # the last: not `collecting`'s
    await all_readable(store, 9)

    async def streamed() -> bool:
        rows = await owner.fetch("SELECT stream_id, version FROM streams ORDER BY stream_id")
        return [(r["stream_id"], r["version"]) for r in rows] == [("job-1", 3), ("node-a", 6)]

    async with running(runner, listener):
        # Rounds of two events read from the place of `streams`, the older: `collecting`
        # takes part in each, and is given only what is past its own place, once.
        await eventually(streamed)
        await eventually(lambda: collected(collecting, [f"node-a@{v}" for v in range(1, 7)]))
    last = await owner.fetchval("SELECT max(position) FROM events")
    assert await checkpoint_of(owner, "streams") == last
    assert await checkpoint_of(owner, "collecting") == last
    # Its batches committed without waiting for the disk: a crash loses them with their
    # checkpoint, and they are applied again.
    assert collecting.commits == {"off"}


async def collected(projection: Collecting, seen: list[str]) -> bool:
    return projection.seen == seen


async def checkpoint_of(owner: asyncpg.Connection, name: str) -> int | None:
    position: int | None = await owner.fetchval(
        "SELECT position FROM projection_checkpoints WHERE name = $1", name
    )
    return position
