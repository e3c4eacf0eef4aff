"""Group commit: appends made at once share statements and commits, and each still gets its own
outcome; and the batching rules themselves."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from controlplane.events.errors import ConcurrencyError
from controlplane.events.group_commit import GroupCommit
from controlplane.events.metadata import Metadata
from controlplane.events.records import StreamAppend
from controlplane.events.store import EventStore
from tests.events import Pinged

META = Metadata(actor="user:alice", tenant="acme")


async def test_appends_made_at_once_share_transactions_and_keep_their_own_versions(
    store: EventStore, owner: asyncpg.Connection
) -> None:
    appended = await asyncio.gather(
        *(store.append(f"job-{k}", 0, [Pinged(n=k), Pinged(n=-k)], META) for k in range(40))
    )
    # Fewer transactions than appends: the events of several appends share an xid.
    assert len({a.xid for a in appended}) < 40
    for k, one in enumerate(appended):
        assert one.stream_id == f"job-{k}" and one.version == 2
        assert [e.event for e in await store.read_stream(f"job-{k}")] == [Pinged(n=k), Pinged(n=-k)]
        stored = await owner.fetch(
            "SELECT position FROM events WHERE stream_id = $1 ORDER BY stream_version", f"job-{k}"
        )
        assert tuple(r["position"] for r in stored) == one.positions
    assert await owner.fetchval("SELECT count(*) FROM events") == 80


async def test_a_stale_append_in_a_batch_fails_alone(
    store: EventStore, owner: asyncpg.Connection
) -> None:
    await store.append("job-old", 0, [Pinged(n=1)], META)
    results = await asyncio.gather(
        store.append("job-a", 0, [Pinged(n=1)], META),
        store.append("job-old", 0, [Pinged(n=2)], META),  # the stream is at version 1
        store.append("job-b", 0, [Pinged(n=1)], META),
        return_exceptions=True,
    )
    assert isinstance(results[1], ConcurrencyError)
    assert "job-old" in str(results[1]) and "expected version 0" in str(results[1])
    assert [type(r).__name__ for r in (results[0], results[2])] == ["Appended", "Appended"]
    assert [e.event for e in await store.read_stream("job-old")] == [Pinged(n=1)]
    assert await owner.fetchval("SELECT count(*) FROM events") == 3


async def test_two_appends_to_one_stream_at_once_one_wins(store: EventStore) -> None:
    results = await asyncio.gather(
        store.append("job-x", 0, [Pinged(n=1)], META),
        store.append("job-x", 0, [Pinged(n=2)], META),
        return_exceptions=True,
    )
    assert sorted(type(r).__name__ for r in results) == ["Appended", "ConcurrencyError"]
    assert len(await store.read_stream("job-x")) == 1


async def test_an_append_postgres_refuses_fails_alone(
    store: EventStore, owner: asyncpg.Connection
) -> None:
    # jsonb holds no NUL: this one passes Python's checks and fails the whole statement it is in.
    results = await asyncio.gather(
        store.append("job-a", 0, [Pinged(n=1)], META),
        store.append("job-nul", 0, [Pinged(n=1, note="a\0b")], META),
        store.append("job-b", 0, [Pinged(n=1)], META),
        return_exceptions=True,
    )
    assert isinstance(results[1], asyncpg.PostgresError)
    assert [type(r).__name__ for r in (results[0], results[2])] == ["Appended", "Appended"]
    streams = await owner.fetch("SELECT DISTINCT stream_id FROM events ORDER BY 1")
    assert [r["stream_id"] for r in streams] == ["job-a", "job-b"]


async def test_append_many_appends_what_is_current_and_leaves_out_what_is_not(
    store: EventStore, pool: asyncpg.Pool
) -> None:
    await store.append("job-moved", 0, [Pinged(n=1)], META)
    async with pool.acquire() as conn, conn.transaction():
        results = await store.append_many(
            [
                StreamAppend("job-a", 0, [Pinged(n=1), Pinged(n=2)], META),
                StreamAppend("job-moved", 0, [Pinged(n=9)], META),
                StreamAppend("job-b", 0, [Pinged(n=3)], META),
            ],
            conn=conn,
        )
    assert results[1] is None
    assert results[0] is not None and results[0].version == 2
    assert results[2] is not None and results[2].version == 1
    assert results[0].xid == results[2].xid  # one transaction
    assert [e.event for e in await store.read_stream("job-moved")] == [Pinged(n=1)]
    assert [e.event for e in await store.read_stream("job-a")] == [Pinged(n=1), Pinged(n=2)]


async def test_append_many_refuses_a_stream_twice(store: EventStore, pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(ValueError, match="a stream appears twice"):
            await store.append_many([StreamAppend("job-a", 0, [Pinged(n=1)], META)] * 2, conn=conn)
    assert await store.read_stream("job-a") == []


# The batching rules, on a writer that records its batches.


class Recorder:
    def __init__(self, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.fail_on = fail_on
        self.gate = asyncio.Event()
        self.gate.set()

    async def write(self, items: list[str]) -> list[str]:
        await self.gate.wait()
        if self.fail_on in items:
            raise ValueError(f"{self.fail_on} is bad")
        self.batches.append(items)
        return [item.upper() for item in items]


def first_letter(item: str) -> str:
    return item[0]


async def test_callers_started_together_share_the_first_batch() -> None:
    recorder = Recorder()
    group = GroupCommit(recorder.write, key=str)
    assert await asyncio.gather(*(group.submit(f"x{k}") for k in range(5))) == [
        f"X{k}" for k in range(5)
    ]
    assert recorder.batches == [[f"x{k}" for k in range(5)]]


async def test_items_wait_while_the_slots_are_busy_and_go_out_together() -> None:
    recorder = Recorder()
    recorder.gate.clear()
    group = GroupCommit(recorder.write, key=str, slots=1)
    first = asyncio.create_task(group.submit("a"))
    await asyncio.sleep(0.01)  # "a" is being written (held at the gate)
    later = [asyncio.create_task(group.submit(item)) for item in ("b", "c", "d")]
    await asyncio.sleep(0.01)
    recorder.gate.set()
    assert await first == "A"
    assert [await task for task in later] == ["B", "C", "D"]
    assert recorder.batches == [["a"], ["b", "c", "d"]]


async def test_items_with_one_key_never_share_a_batch() -> None:
    recorder = Recorder()
    group = GroupCommit(recorder.write, key=first_letter)
    results = await asyncio.gather(*(group.submit(item) for item in ("a1", "b1", "a2", "a3")))
    assert results == ["A1", "B1", "A2", "A3"]
    assert recorder.batches == [["a1", "b1"], ["a2"], ["a3"]]


async def test_a_failing_batch_is_written_item_by_item() -> None:
    recorder = Recorder(fail_on="bad")
    group = GroupCommit(recorder.write, key=str)
    results = await asyncio.gather(
        *(group.submit(item) for item in ("ok1", "bad", "ok2")), return_exceptions=True
    )
    assert results[0] == "OK1" and results[2] == "OK2"
    assert isinstance(results[1], ValueError) and str(results[1]) == "bad is bad"
    assert recorder.batches == [["ok1"], ["ok2"]]


async def test_an_item_cancelled_before_its_batch_is_not_written() -> None:
    recorder = Recorder()
    recorder.gate.clear()
    group = GroupCommit(recorder.write, key=str, slots=1)
    first = asyncio.create_task(group.submit("a"))
    await asyncio.sleep(0.01)
    doomed = asyncio.create_task(group.submit("b"))
    kept = asyncio.create_task(group.submit("c"))
    await asyncio.sleep(0.01)
    doomed.cancel()
    recorder.gate.set()
    assert (await first, await kept) == ("A", "C")
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert recorder.batches == [["a"], ["c"]]
    await group.close()
