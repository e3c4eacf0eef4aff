"""Log search's indexers as the control plane's background worker (controlplane.logs.indexer.
LogIndexers): they empty the queue by themselves, with no lifecycle manager; several at once
(in one replica or in several) copy every line exactly once, each taking ranges the others do
not hold; a search stays exact while they copy; and they stop with the control plane's other
workers, leaving every line copied or queued, never half of a batch."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import UUID

import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from controlplane.database import create_pool
from controlplane.http.app import create_app
from controlplane.http.keys import BACKGROUND, PLANE
from controlplane.logs.indexer import (
    BATCH_LINES,
    DEFAULT_LOG_INDEXERS,
    LOG_INDEXERS_ENV,
    LogIndexers,
    log_indexers_from_env,
)
from controlplane.logs.store import write_lines
from controlplane.queries import Q
from tests.controlplane.logs.test_log_search_indexer import counts, found, job_of, lines
from tests.polling import eventually

POLL_S = 0.05


@asynccontextmanager
async def indexing(indexers: LogIndexers) -> AsyncIterator[asyncio.Task[None]]:
    """`indexers` running for the block, then stopped, and their task's outcome raised."""
    task = asyncio.create_task(indexers.run())
    try:
        yield task
    finally:
        indexers.stop()
        async with asyncio.timeout(10):
            await task


async def store(
    pool: asyncpg.Pool | asyncpg.Connection, job: UUID, first: int, total: int, batch: int
) -> None:
    """Lines `first`.. of `job`, `total` of them, one statement (one queued range) a `batch`."""
    for start in range(first, first + total, batch):
        await write_lines(pool, lines(job, start, min(batch, first + total - start)))


async def drained(owner: asyncpg.Connection, copied: int, queued: int = 0) -> None:
    """Wait until `copied` lines are copied and `queued` left in the queue."""

    async def done() -> bool:
        return await counts(owner) == (copied, queued)

    await eventually(done)


async def test_the_indexers_empty_the_queue_by_themselves_and_again_after_idling(
    pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    jobs = [await job_of(owner, "acme") for _ in range(3)]
    for job in jobs:
        await store(pool, job, 1, 12_000, 1_000)
    indexers = LogIndexers(pool, count=1, poll_s=POLL_S)
    async with indexing(indexers):
        await drained(owner, 36_000)
        # Idle now, polling: lines stored later are copied too.
        await asyncio.sleep(3 * POLL_S)
        await store(pool, jobs[0], 12_001, 500, 500)
        await drained(owner, 36_500)
    assert indexers.copied == 36_500
    assert len(await found(pool, "acme", "loss")) == 1000


async def test_two_replicas_indexers_copy_every_line_exactly_once(
    pool: asyncpg.Pool, owner: asyncpg.Connection, db_url: str
) -> None:
    jobs = [await job_of(owner, tenant) for tenant in ("acme", "globex") for _ in range(4)]
    for job in jobs:
        await store(pool, job, 1, 15_000, 500)
    total = 15_000 * len(jobs)
    other_pool = await create_pool(db_url, min_size=1, max_size=2)
    try:
        # Two replicas, each running two (as DEFAULT_LOG_INDEXERS does).
        first = LogIndexers(pool, count=2, poll_s=POLL_S)
        second = LogIndexers(other_pool, count=2, poll_s=POLL_S)
        async with indexing(first), indexing(second):
            await drained(owner, total)
    finally:
        await other_pool.close()
    # job_log_search's key (job_id, id) refuses a line copied twice, and every one is there.
    assert first.copied + second.copied == total
    assert first.copied > 0 and second.copied > 0
    missing = await owner.fetchval(
        "SELECT count(*) FROM job_logs l LEFT JOIN job_log_search s USING (job_id, id)"
        " WHERE s.id IS NULL"
    )
    assert missing == 0


async def test_an_indexer_copies_other_ranges_while_another_holds_its_own(
    pool: asyncpg.Pool, owner: asyncpg.Connection, db_url: str
) -> None:
    """No lock over the whole queue: an indexer in the middle of its batch (another replica's,
    held open here) keeps only its own ranges from the others."""
    jobs = [await job_of(owner, "acme") for _ in range(2)]
    await store(pool, jobs[0], 1, BATCH_LINES, BATCH_LINES)
    await store(pool, jobs[1], 1, 25_000, 5_000)
    held = await asyncpg.connect(db_url)
    try:
        async with held.transaction():
            assert await held.fetchval(Q["index_job_log_lines"], BATCH_LINES) == BATCH_LINES
            indexers = LogIndexers(pool, count=2, poll_s=POLL_S)
            async with indexing(indexers):
                # All but the held batch, which is still queued until its indexer commits.
                await drained(owner, 25_000, queued=BATCH_LINES)
        await drained(owner, 35_000)
    finally:
        await held.close()
    assert indexers.copied == 25_000


async def test_a_search_stays_exact_while_the_indexers_copy(
    pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    jobs = [await job_of(owner, "acme") for _ in range(4)]
    expected: list[tuple[UUID, int]] = []
    indexers = LogIndexers(pool, count=2, poll_s=POLL_S)
    async with indexing(indexers):
        for round_ in range(6):
            first = 1 + round_ * 5_001
            for job in jobs:
                await store(pool, job, first, 5_000, 1_000)
                await write_lines(pool, lines(job, first + 5_000, 1, "CUDA out of memory {}"))
                expected.append((job, first + 5_000))
            # While the indexers move this round's lines from the queue to the copy, each
            # matching line is found once, none missed.
            for _ in range(5):
                assert sorted(await found(pool, "acme", "out of memory")) == sorted(expected)
        await drained(owner, 6 * 5_001 * len(jobs))
    assert len(await found(pool, "acme", "out of memory")) == len(expected)


async def test_the_indexers_stop_with_the_control_plane_leaving_no_half_batch(
    db_url: str, owner: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """The server's own indexers (no lifecycle manager indexes any more) copy what is stored,
    and stop in order when the server does, in the middle of a backlog: each line copied or
    still queued, never both, never neither; the workers end without an error."""
    jobs = [await job_of(owner, "acme") for _ in range(4)]
    writer = await create_pool(db_url, min_size=1, max_size=2)
    try:
        for job in jobs:
            await store(writer, job, 1, 5_000, 1_000)
        with caplog.at_level(logging.ERROR):
            app = create_app(db_url, poll_interval=0.1, log_indexers=2)
            async with TestServer(app):
                plane = app[PLANE]
                assert plane.log_indexers.count == 2
                await drained(owner, 20_000)
                # A backlog of 72 batches, committed at once: written batch by batch, the
                # indexers copied it as it came (on a loaded machine, all of it before the
                # stop took effect), leaving nothing to cut short.
                async with writer.acquire() as conn, conn.transaction():
                    for job in jobs:
                        await store(conn, job, 5_001, 90_000, 5_000)

                async def started() -> bool:
                    return plane.log_indexers.copied > 20_000

                await eventually(started)
                background = app[BACKGROUND]
            assert background.done() and not background.cancelled()
            assert background.exception() is None
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        copied, queued = await counts(owner)
        assert copied + queued == 4 * 95_000
        assert copied == plane.log_indexers.copied
        # The backlog was cut short, not finished (else this test showed no stop mid-way).
        assert queued > 0
        both = await owner.fetchval(
            "SELECT count(*) FROM job_log_search s JOIN job_log_search_queue q"
            " ON q.job_id = s.job_id AND s.id BETWEEN q.first_id AND q.last_id"
        )
        assert both == 0
    finally:
        await writer.close()


def test_the_operator_sets_how_many_indexers_a_replica_runs() -> None:
    assert log_indexers_from_env({}) == DEFAULT_LOG_INDEXERS
    assert log_indexers_from_env({LOG_INDEXERS_ENV: " 4 "}) == 4
    assert log_indexers_from_env({LOG_INDEXERS_ENV: "0"}) == 0
    for wrong in ("-1", "65", "two", "1.5"):
        with pytest.raises(ValueError, match=LOG_INDEXERS_ENV):
            log_indexers_from_env({LOG_INDEXERS_ENV: wrong})
