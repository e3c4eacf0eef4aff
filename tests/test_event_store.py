"""Appends with optimistic concurrency, stream reads, metadata, upcasting and bad input."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from opentelemetry.sdk.trace import TracerProvider

from controlplane.events.errors import ConcurrencyError, MalformedEvent, UnknownEventType
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.queries import Q
from tests.events import Pinged, Renamed, Unregistered

META = Metadata(actor="user:alice", tenant="acme", correlation_id="req-1")


async def count(owner: asyncpg.Connection) -> int:
    return int(await owner.fetchval("SELECT count(*) FROM events"))


async def test_append_then_read_stream(store: EventStore) -> None:
    first = await store.append("job-1", 0, [Pinged(n=1), Pinged(n=2)], META)
    second = await store.append("job-1", 2, [Pinged(n=3)], META)
    assert (first.version, second.version) == (2, 3)
    assert second.positions[0] > first.positions[-1]
    events = await store.read_stream("job-1")
    assert [e.stream_version for e in events] == [1, 2, 3]
    assert [e.event for e in events] == [Pinged(n=1), Pinged(n=2), Pinged(n=3)]
    assert all(e.metadata == META for e in events)
    assert [e.event for e in await store.read_stream("job-1", from_version=3)] == [Pinged(n=3)]
    assert await store.read_stream("job-nope") == []


async def test_stale_expected_version_is_a_conflict_that_writes_nothing(
    store: EventStore, owner: asyncpg.Connection
) -> None:
    await store.append("job-1", 0, [Pinged(n=1)], META)
    for expected in (0, 2, 7):
        with pytest.raises(ConcurrencyError) as caught:
            await store.append("job-1", expected, [Pinged(n=9), Pinged(n=10)], META)
        assert "job-1" in str(caught.value)
        assert f"expected version {expected}" in str(caught.value)
        assert "at version 1" in str(caught.value)
        assert caught.value.actual == 1
    assert await count(owner) == 1


async def test_concurrent_appends_at_one_version_exactly_one_wins(
    store: EventStore, owner: asyncpg.Connection
) -> None:
    await store.append("job-1", 0, [Pinged(n=0)], META)
    results = await asyncio.gather(
        *(store.append("job-1", 1, [Pinged(n=i)], META) for i in range(10)),
        return_exceptions=True,
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(r, ConcurrencyError) for r in results if r not in winners)
    assert await count(owner) == 2


async def test_head_written_by_a_younger_transaction_is_refused(
    pool: asyncpg.Pool, store: EventStore
) -> None:
    """An older transaction must not append after a younger one's event in the same stream:
    (xid, position) order would put its event first."""
    await store.append("job-1", 0, [Pinged(n=1)], META)
    async with pool.acquire() as older, older.transaction():
        await older.execute("SELECT pg_current_xact_id()")  # takes its xid now
        await store.append("job-1", 1, [Pinged(n=2)], META)  # a younger transaction
        with pytest.raises(ConcurrencyError, match="younger transaction"):
            await store.append("job-1", 2, [Pinged(n=3)], META, conn=older)
    assert [e.stream_version for e in await store.read_stream("job-1")] == [1, 2]


async def test_appends_inside_a_caller_transaction_commit_or_roll_back_together(
    pool: asyncpg.Pool, store: EventStore, owner: asyncpg.Connection
) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await store.append("job-a", 0, [Pinged(n=1)], META, conn=conn)
                await store.append("job-b", 0, [Pinged(n=2)], META, conn=conn)
                raise RuntimeError("abort")
        assert await count(owner) == 0
        async with conn.transaction():
            await store.append("job-a", 0, [Pinged(n=1)], META, conn=conn)
            await store.append("job-a", 1, [Pinged(n=2)], META, conn=conn)
    assert [e.stream_version for e in await store.read_stream("job-a")] == [1, 2]


async def test_bad_input_is_refused_with_stream_and_version_and_writes_nothing(
    store: EventStore, owner: asyncpg.Connection
) -> None:
    await store.append("job-1", 0, [Pinged(n=1)], META)
    with pytest.raises(UnknownEventType, match=r"stream job-1 version 3: .*Unregistered"):
        await store.append("job-1", 1, [Pinged(n=2), Unregistered(n=1)], META)
    with pytest.raises(ValueError, match="invalid stream id"):
        await store.append("no category", 0, [Pinged(n=1)], META)
    with pytest.raises(ValueError, match="nothing to append"):
        await store.append("job-1", 1, [], META)
    with pytest.raises(ValueError, match="expected version must be >= 0"):
        await store.append("job-1", -1, [Pinged(n=1)], META)
    assert await count(owner) == 1


async def test_malformed_stored_data_and_unknown_types_are_named_on_read(
    store: EventStore, owner: asyncpg.Connection
) -> None:
    insert = (
        "INSERT INTO events (stream_id, stream_version, type, schema_version, data, metadata)"
        " VALUES ($1, 1, $2, 1, $3, $4)"
    )
    meta = META.model_dump_json()
    await owner.execute(insert, "job-bad", "test.Pinged", '{"n": "not a number"}', meta)
    await owner.execute(insert, "job-new", "test.FromTheFuture", "{}", meta)
    with pytest.raises(MalformedEvent, match=r"stream job-bad version 1 .*n: "):
        await store.read_stream("job-bad")
    with pytest.raises(UnknownEventType, match=r"stream job-new version 1 .*FromTheFuture"):
        await store.read_stream("job-new")


async def test_database_refuses_data_that_is_not_an_object(owner: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await owner.execute(
            "INSERT INTO events (stream_id, stream_version, type, schema_version, data, metadata)"
            " VALUES ('job-1', 1, 'test.Pinged', 1, '[1]', '{}')"
        )


async def test_old_schema_versions_are_upcast_on_read(
    store: EventStore, owner: asyncpg.Connection
) -> None:
    await owner.execute(
        "INSERT INTO events (stream_id, stream_version, type, schema_version, data, metadata)"
        " VALUES ('tenant-acme', 1, 'test.Renamed', 1, $1, $2)",
        '{"name": "Ada Lovelace"}',
        META.model_dump_json(),
    )
    await store.append("tenant-acme", 1, [Renamed(first="Grace", last="Hopper")], META)
    events = await store.read_stream("tenant-acme")
    assert [e.event for e in events] == [
        Renamed(first="Ada", last="Lovelace"),
        Renamed(first="Grace", last="Hopper"),
    ]
    stored = await owner.fetch("SELECT schema_version FROM events ORDER BY position")
    assert [r["schema_version"] for r in stored] == [1, 2]


async def test_metadata_carries_the_current_trace_context(store: EventStore) -> None:
    tracer = TracerProvider().get_tracer("tests")
    with tracer.start_as_current_span("submit") as span:
        meta = Metadata.capture("user:alice", tenant="acme", correlation_id="c", causation_id="1")
        await store.append("job-1", 0, [Pinged(n=1)], meta)
    [recorded] = await store.read_stream("job-1")
    assert recorded.metadata.tenant == "acme"
    assert recorded.metadata.causation_id == "1"
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert recorded.metadata.trace["traceparent"].split("-")[1] == trace_id
    continued = tracer.start_span("claim", context=recorded.metadata.trace_context())
    assert continued.get_span_context().trace_id == span.get_span_context().trace_id


async def test_reading_the_log_walks_its_index_instead_of_sorting_it(
    owner: asyncpg.Connection,
) -> None:
    # A reader far behind (a rebuild, a resumed follower) reads a long log batch by batch:
    # each batch must cost its own size, not a sort of everything after the checkpoint.
    await owner.execute(
        "INSERT INTO events (stream_id, stream_version, type, schema_version, data, metadata)"
        " SELECT 'job-' || g, 1, 'test.Pinged', 1, '{\"n\": 1}', '{\"actor\": \"a\"}'"
        " FROM generate_series(1, 5000) g"
    )
    await owner.execute("ANALYZE events")
    for name, args in (("read_log", "('0', 0, 100, NULL)"), ("log_tail", "")):
        await owner.execute(f"PREPARE {name}_plan AS {Q[name]}".replace(";", ""))
        plan = await owner.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name}_plan{args}")
        assert '"Sort"' not in plan and "events_log_order" in plan, plan
