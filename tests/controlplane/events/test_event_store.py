"""What only the Postgres store gives: appends in a caller's transaction, stored data read back
(named when bad, upcast when old) and a log read along its index. The contract every store
keeps is tested in test_event_store_contract.py."""

from __future__ import annotations

import asyncpg
import pytest

from controlplane.events.errors import ConcurrencyError, MalformedEvent, UnknownEventType
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.queries import Q
from tests.events import Pinged, Renamed

META = Metadata(actor="user:alice", tenant="acme", correlation_id="req-1")


async def count(owner: asyncpg.Connection) -> int:
    return int(await owner.fetchval("SELECT count(*) FROM events"))


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
