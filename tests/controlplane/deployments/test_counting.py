"""The direct path's counting writer against what Postgres refuses, and the agent's checks that
keep a replica's answer from ever being such a row: a tenant's model may return any text and
report any time, and one row jsonb cannot hold must not hold back every count after it."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from controlplane.deployments.counting import CountedBatch, CountedTask, Counting, MemoUse
from node_agent.inference import stored
from node_agent.replica_client import ReplicaError
from node_agent.replica_client import _milliseconds as milliseconds


def task(output: str) -> CountedTask:
    now = datetime.now(UTC)
    return CountedTask(
        task_id=uuid.uuid4(),
        tenant="acme",
        deployment="dbl",
        items=1,
        input="[1]",
        state="succeeded",
        output=output,
        error=None,
        memo="off",
        memo_key=None,
        replica=uuid.uuid4(),
        tries=1,
        submitted_at=now,
        finished_at=now,
        step_times="[]",
    )


async def test_a_row_postgres_refuses_is_left_out_and_every_other_is_written(
    pool: asyncpg.Pool,
) -> None:
    counting = Counting(pool)
    good = [task("[2]") for _ in range(40)]
    bad = task('["\\ud800"]')  # JSON text that jsonb refuses as it parses (an unpaired surrogate)
    for counted in [*good[:25], bad, *good[25:]]:
        counting.record(counted)
    counting.stop()
    await counting.run()  # returns: the refused row held nothing back for good
    await counting.flush()
    written = await pool.fetch(
        "SELECT task_id FROM serving_tasks WHERE task_id = ANY($1::uuid[])",
        [t.task_id for t in [*good, bad]],
    )
    assert {row["task_id"] for row in written} == {t.task_id for t in good}


async def test_a_task_postgres_refuses_drops_no_batch_or_memo_row_beside_it(
    pool: asyncpg.Pool,
) -> None:
    """A bad task (one tenant's) in the same group as a batch and a memo entry (another's):
    the task alone is left out."""
    counting = Counting(pool)
    bad = dataclasses.replace(task("[2]"), state="failed", output=None, error="bad\0nul")
    now = datetime.now(UTC)
    batch = CountedBatch(
        uuid.uuid4(), "globex", "other", uuid.uuid4(), 1, 1, "full", "succeeded", 1.0, 1.0, now
    )
    memo = MemoUse("globex", "other", b"key-" + uuid.uuid4().bytes, "[3]", now)
    good = task("[2]")
    counting.record(bad)
    counting.record(good, (batch,), memo)
    counting.stop()
    await counting.run()
    await counting.flush()
    written = await pool.fetch(
        "SELECT task_id FROM serving_tasks WHERE task_id = ANY($1::uuid[])",
        [bad.task_id, good.task_id],
    )
    assert [row["task_id"] for row in written] == [good.task_id]
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM serving_batches WHERE batch_id = $1", batch.batch_id
        )
        == 1
    )
    assert await pool.fetchval("SELECT count(*) FROM serving_memo WHERE key = $1", memo.key) == 1


def test_outputs_jsonb_cannot_hold_are_a_failure_of_the_task_not_a_row() -> None:
    assert stored(["é", "😀", 1.5]) == ('["é", "😀", 1.5]', None)
    for outputs, why in (
        (["\ud800"], "not valid Unicode"),
        (["a\0b"], "NUL"),
        ([float("inf")], "not JSON"),
        ([float("nan")], "not JSON"),
    ):
        text, error = stored(outputs)
        assert text is None and error is not None and why in error


@pytest.mark.parametrize("reported", [float("inf"), float("nan"), -1.0, 10**400, True, "3"])
def test_a_replica_s_time_is_a_real_one(reported: object) -> None:
    assert milliseconds({"inference_ms": 2.5}, "inference_ms") == 2.5
    with pytest.raises(ReplicaError, match="inference_ms"):
        milliseconds({"inference_ms": reported}, "inference_ms")


async def test_a_group_refused_late_is_written_again_whole_but_its_bad_row(
    pool: asyncpg.Pool,
) -> None:
    """The group's first try writes its tasks and batches before Postgres refuses its memo row
    (the last kind): that try is undone, and the second writes each of them once, without the
    refused row."""
    counting = Counting(pool)
    now = datetime.now(UTC)
    tasks = [task("[2]") for _ in range(5)]
    batches = [
        CountedBatch(
            uuid.uuid4(), "acme", "dbl", uuid.uuid4(), 1, 1, "idle", "succeeded", 1.0, 1.0, now
        )
        for _ in tasks
    ]
    good = MemoUse("acme", "dbl", b"key-" + uuid.uuid4().bytes, "[2]", now)
    bad = MemoUse("acme", "dbl", b"key-" + uuid.uuid4().bytes, '["\\ud800"]', now)
    for counted, batch in zip(tasks, batches, strict=True):
        counting.record(counted, (batch,))
    counting.record(task("[2]"), (), good)
    counting.record(task("[2]"), (), bad)
    counting.stop()
    await counting.run()
    await counting.flush()
    ids = [t.task_id for t in tasks]
    assert await pool.fetchval(
        "SELECT count(*) FROM serving_tasks WHERE task_id = ANY($1::uuid[])", ids
    ) == len(tasks)
    assert await pool.fetchval(
        "SELECT count(*) FROM serving_batches WHERE batch_id = ANY($1::uuid[])",
        [b.batch_id for b in batches],
    ) == len(batches)
    memo = await pool.fetch(
        "SELECT key FROM serving_memo WHERE key = ANY($1::bytea[])", [good.key, bad.key]
    )
    assert [row["key"] for row in memo] == [good.key]


async def test_groups_of_every_kind_are_all_written_once(pool: asyncpg.Pool) -> None:
    """Many groups gathered while the requests go on: every task, batch and memo entry
    handed in is written, once (a batch that several tasks name, a memo key used again)."""
    counting = Counting(pool)
    writer = asyncio.create_task(counting.run())
    now = datetime.now(UTC)
    batch = CountedBatch(
        uuid.uuid4(), "acme", "dbl", uuid.uuid4(), 3, 3, "full", "succeeded", 1.0, 1.0, now
    )
    key = b"key-" + uuid.uuid4().bytes
    handed: list[CountedTask] = []
    for n in range(60):
        counted = task("[2]")
        handed.append(counted)
        counting.record(counted, (batch,), MemoUse("acme", "dbl", key, "[2]", now))
        if n % 7 == 0:
            await asyncio.sleep(0.005)  # some groups close in between
    counting.stop()
    await writer
    assert await pool.fetchval(
        "SELECT count(*) FROM serving_tasks WHERE task_id = ANY($1::uuid[])",
        [t.task_id for t in handed],
    ) == len(handed)
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM serving_batches WHERE batch_id = $1", batch.batch_id
        )
        == 1
    )
    assert await pool.fetchval("SELECT count(*) FROM serving_memo WHERE key = $1", key) == 1
