"""Log search's indexer (migrations/0035_log_search_indexer.sql): lines are queued by the
writer's statement and copied behind it into the search's indexed table; a search finds a line
the moment its writer commits, exactly once, before, during and after the copy; retention
forgets the copy; and where the server has pg_trgm the copy carries the trigram index."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import asyncpg

from controlplane.logs.indexer import BATCH_LINES, index_queued_lines
from controlplane.logs.lines import LogLine, Stream
from controlplane.logs.search import LogSearch, search
from controlplane.logs.store import write_lines
from controlplane.queries import Q

START = datetime(2026, 11, 1, 12, tzinfo=UTC)


async def job_of(owner: asyncpg.Connection, tenant: str, state: str = "PROCESSING") -> UUID:
    """A job of `tenant` in job_status, where the writer reads a job's tenant."""
    job_id = uuid4()
    await owner.execute(
        "INSERT INTO job_status (job_id, tenant, name, state, attempt, restarts, priority,"
        " labels, submitted_at, updated_at, version, doc)"
        " VALUES ($1, $2, 'indexed', $3, 1, 0, 0, '{}', now(), now(), 1, '{}')",
        job_id,
        tenant,
        state,
    )
    return job_id


def lines(job_id: UUID, first: int, count: int, text: str = "step {} loss 0.5") -> list[LogLine]:
    return [
        LogLine(
            job_id=job_id,
            attempt=1,
            learner=0,
            stream=Stream.STDOUT,
            seq=seq,
            at=START + timedelta(seconds=seq),
            text=text.format(seq),
        )
        for seq in range(first, first + count)
    ]


async def found(pool: asyncpg.Pool, tenant: str, pattern: str) -> list[tuple[UUID, int]]:
    """Every match, each page in turn, as (job, id) newest first."""
    return [
        (s.line.job_id, s.id)
        for s in await search(pool, LogSearch(tenant=tenant, pattern=pattern), limit=1000)
    ]


async def counts(owner: asyncpg.Connection) -> tuple[int, int]:
    """Lines copied for search, and lines queued for the indexer."""
    copied = await owner.fetchval("SELECT count(*) FROM job_log_search")
    queued = await owner.fetchval(
        "SELECT coalesce(sum(last_id - first_id + 1), 0) FROM job_log_search_queue"
    )
    return copied, queued


async def test_a_stored_line_is_found_at_once_and_the_same_after_indexing(
    pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    acme, other = await job_of(owner, "acme"), await job_of(owner, "globex")
    await write_lines(pool, lines(acme, 1, 30))
    await write_lines(pool, lines(acme, 31, 5, "CUDA out of memory at {}"))
    await write_lines(pool, lines(other, 1, 10, "CUDA out of memory at {}"))
    assert await counts(owner) == (0, 45)  # one queued range per job and statement
    before = await found(pool, "acme", "out of memory")
    assert before == [(acme, i) for i in range(35, 30, -1)]
    assert len(await found(pool, "acme", "loss")) == 30

    assert await index_queued_lines(pool, budget_s=10) == 45
    assert await counts(owner) == (45, 0)
    assert await found(pool, "acme", "out of memory") == before
    assert len(await found(pool, "acme", "loss")) == 30
    assert len(await found(pool, "globex", "out of memory")) == 10

    # Indexed and queued lines side by side: a line written now is found with the others.
    await write_lines(pool, lines(acme, 36, 1, "CUDA out of memory at {}"))
    assert await found(pool, "acme", "out of memory") == [(acme, 36), *before]


async def test_a_search_sees_each_line_once_while_the_indexer_copies_it(
    pool: asyncpg.Pool, owner: asyncpg.Connection, db_url: str
) -> None:
    job = await job_of(owner, "acme")
    await write_lines(pool, lines(job, 1, 20))
    expected = [(job, i) for i in range(20, 0, -1)]
    indexer = await asyncpg.connect(db_url)
    try:
        async with indexer.transaction():
            assert await indexer.fetchval(Q["index_job_log_lines"], BATCH_LINES) == 20
            # Copied but not committed: searches still read the queued lines, once.
            assert await found(pool, "acme", "loss") == expected
            # A range the indexer holds is not taken by a second one (SKIP LOCKED).
            assert await pool.fetchval(Q["index_job_log_lines"], BATCH_LINES) == 0
        assert await found(pool, "acme", "loss") == expected
        assert await counts(owner) == (20, 0)
    finally:
        await indexer.close()


async def test_the_indexer_takes_about_its_batch_oldest_ranges_first(
    pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    job = await job_of(owner, "acme")
    for first in range(1, 30_001, 6_000):
        await write_lines(pool, lines(job, first, 6_000))
    # Whole ranges, oldest first, until the batch is reached: 12,000 of the 30,000.
    assert await pool.fetchval(Q["index_job_log_lines"], BATCH_LINES) == 12_000
    copied = await owner.fetchval("SELECT max(id) FROM job_log_search")
    assert copied == 12_000
    # The rest on the next calls; all of it found all along.
    assert len(await found(pool, "acme", "loss")) == 1000
    assert await index_queued_lines(pool, budget_s=10) == 18_000
    assert await counts(owner) == (30_000, 0)


async def test_lines_of_a_job_without_a_tenant_are_neither_queued_nor_found(
    pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    stranger = uuid4()  # not in job_status: its lines have no tenant (0034)
    assert await write_lines(pool, lines(stranger, 1, 5)) == 5
    assert await counts(owner) == (0, 0)
    assert await index_queued_lines(pool, budget_s=10) == 0


async def test_retention_forgets_the_copy_and_the_queue_with_the_lines(
    pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    ended = await job_of(owner, "acme", "COMPLETED")
    await owner.execute(
        "UPDATE job_status SET updated_at = now() - interval '2 days' WHERE job_id = $1", ended
    )
    await write_lines(pool, lines(ended, 1, 10))
    await index_queued_lines(pool, budget_s=10)
    await write_lines(pool, lines(ended, 11, 5))
    await owner.execute(
        "UPDATE job_log_heads SET updated_at = now() - interval '2 days' WHERE job_id = $1", ended
    )
    assert await counts(owner) == (10, 5)
    assert await pool.fetchval(Q["forget_job_logs"], 86_400.0, 10) == 1
    assert await counts(owner) == (0, 0)
    assert await found(pool, "acme", "loss") == []


async def test_the_trigram_index_is_on_the_copy_where_the_server_has_pg_trgm(
    pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    """Run against a server with pg_trgm and btree_gin (TRAINYARD_DATABASE_URL) for the index;
    against one without, that no trigram index is made and searches work all the same."""
    extensions = await owner.fetchval(
        "SELECT count(*) FROM pg_extension WHERE extname IN ('pg_trgm', 'btree_gin')"
    )
    indexes = {
        r["indexname"]: r["tablename"]
        for r in await owner.fetch(
            "SELECT indexname, tablename FROM pg_indexes"
            " WHERE tablename IN ('job_logs', 'job_log_search')"
        )
    }
    # Nothing of search's left on the writers' table.
    assert "job_logs_search" not in indexes and "job_logs_tenant_order" not in indexes
    assert indexes.get("job_log_search_trigrams") == ("job_log_search" if extensions else None)

    job = await job_of(owner, "acme")
    await write_lines(pool, lines(job, 1, 2000))
    await write_lines(pool, lines(job, 2001, 3, "CUDA out of memory at {}"))
    await index_queued_lines(pool, budget_s=10)
    await owner.execute("ANALYZE job_log_search")
    if extensions:
        # A table this small is cheapest read whole, or through the tenant's order; what
        # is asked here is that the trigram index serves a pattern when asked to.
        async with owner.transaction():
            await owner.execute("SET LOCAL enable_seqscan = off")
            plan = "\n".join(
                r[0]
                for r in await owner.fetch(
                    "EXPLAIN SELECT id FROM job_log_search WHERE line ~ 'out of memory'"
                )
            )
        assert "job_log_search_trigrams" in plan, plan
        # The indexer merged its lines' entries into the tree: none left pending to clean.
        assert await owner.fetchval("SELECT gin_clean_pending_list('job_log_search_trigrams')") == 0
    assert await found(pool, "acme", "out of memory") == [(job, i) for i in (2003, 2002, 2001)]
