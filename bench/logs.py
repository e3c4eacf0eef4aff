"""Log benchmarks: how fast lines are stored, and how fast a tenant's lines are searched.

`run_search` is `trainyard bench logs`: search across logs (controlplane.logs.search) over a big
kept log, and what its index costs ingestion. Its figures:

- lines: the lines stored in the kept database (`jobs` jobs of `tenants` tenants); the searched
  tenant holds `tenant_lines` of them. Filled on first use by SQL from generated text (training
  progress, data loader and checkpoint notes, warnings, tracebacks, ids, a rare CUDA error),
  copied into the search's table (job_log_search) as the indexer would, with its indexes built
  after the fill, and kept for later runs (`fill_s` 0 then).
- trigram_index: whether the server has pg_trgm and btree_gin, so that migration 0035 built the
  trigram index on job_log_search (without it every search reads the tenant's lines in order:
  slow for rare terms).
- search: for each pattern, p50 and p95 (ms) of `searches` first pages (100 lines, newest first)
  through `search`, the statement the API runs, and how many lines the page held: a rare and a
  common substring, a case-insensitive one, a substring found nowhere, and a regular expression.
- ingest_lines_per_s_with_index / _without_index: lines stored per second by `write_lines` (one
  writer, batches of BATCH lines, as one agent's shipper) into the kept table as migration 0035
  leaves it (each statement's lines queued for the search's indexer by a trigger), and with
  that trigger dropped (no search at all on the writer's path), alternated for `seconds` each;
  each half runs in one transaction that is rolled back, so the kept log does not grow.
  ingest_ratio: the first over the second.
- index_lines_per_s: lines per second one indexer (`index_job_log_lines`, what each of the
  control plane's indexers runs) copies into the search's indexed table, over the lines each
  "with" half queued, in the same transaction. ingest_and_index_lines_per_s is the rate of
  both in turn (lines over writing plus indexing time), what one core sustains with no lag.
- sustained: the writer and the control plane's indexers (`LogIndexers`, 1 and then 2 of
  them) running at once for `seconds` each, the lines committed: the writer flat out, and
  paced at the target (TARGET_LINES_PER_S). For each: lines stored and lines indexed per
  second, the queue's lines at the end and how fast it grew, and keeps_up (the indexers
  copied at least 95 % of what was stored: the queue stays bounded at that rate), and
  drain_s, the seconds the indexers then took to empty the queue (every line stored is copied
  once, or the benchmark fails); stored_ratio_vs_without_index is the stored rate over
  ingest_lines_per_s_without_index.
  sustained_meets_ingest_target: some run stored at least the target and kept up. The lines
  are removed afterwards.
- queued_search: the rare and the common substring searched (p50, p95) while TAIL_LINES of the
  searched tenant's lines, committed, wait for the indexer (a second of 50,000 lines/s that the
  indexer has not reached), and the seconds the indexer then took to copy them.

`run` is the older measure `trainyard bench claims --only logs` reports:

- log_lines_per_s: one writer (as one learner's shipper is) storing batches of BATCH lines with
  `write_lines`: the id reservation, the idempotency check and one COPY per batch.
- raw_copy_lines_per_s: the same lines, batches and connection, COPYed straight into a table of
  the same shape with no reservation and no idempotency check: the ceiling, measured in the
  same run so that the ratio says what the ordering and the exactly-once writes cost.

Both build their LogLines inside the timed loop, as the agent does. Everything runs in a
scratch database on the configured server, dropped at the end.
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg

from bench.scratch import scratch_database
from controlplane.database import connect
from controlplane.logs.indexer import LogIndexers, index_queued_lines
from controlplane.logs.lines import LogLine, Stream
from controlplane.logs.search import LogSearch, search
from controlplane.logs.store import COLUMNS, write_lines

BATCH = 5000
TARGET_LINES_PER_S = 50_000


def _line(job_id: uuid.UUID, seq: int, at: datetime) -> LogLine:
    """A line shaped like a training progress report (about 90 characters)."""
    return LogLine(
        job_id=job_id,
        attempt=1,
        learner=0,
        stream=Stream.STDOUT,
        seq=seq,
        at=at,
        text=f"epoch 3 step {seq} loss {1.0 / seq:.6f} lr 0.000100 throughput 1834.2 samples/s",
    )


class _Learner:
    """One learner's output: batches of consecutive lines of one series."""

    def __init__(self) -> None:
        self.job_id = uuid.uuid4()
        self.next_seq = 1

    async def register(self, owner: asyncpg.Connection, tenant: str) -> None:
        """Make the learner's job one of `tenant`'s (in job_status, where the writer reads a
        job's tenant), so that its lines are filed, queued and searched as a tenant's are."""
        await owner.execute(
            "INSERT INTO job_status (job_id, tenant, name, state, attempt, restarts, priority,"
            " labels, submitted_at, updated_at, version, doc)"
            " VALUES ($1, $2, 'bench-ingest', 'PROCESSING', 1, 0, 0, '{}', now(), now(), 1, '{}')",
            self.job_id,
            tenant,
        )

    def batch(self) -> list[LogLine]:
        at = datetime.now(UTC)
        first, self.next_seq = self.next_seq, self.next_seq + BATCH
        return [_line(self.job_id, seq, at) for seq in range(first, self.next_seq)]


async def run(url: str, *, seconds: float) -> dict[str, Any]:
    async with scratch_database(url, "logs") as scratch:
        return await _measure(scratch, seconds)


async def _measure(url: str, seconds: float) -> dict[str, Any]:
    owner = await connect(url, role=None)
    try:
        # Same columns, constraints and indexes as `job_logs`.
        await owner.execute(
            "CREATE TABLE bench_raw_logs (LIKE job_logs INCLUDING ALL);"
            "GRANT SELECT, INSERT ON bench_raw_logs TO trainyard_app"
        )
    finally:
        await owner.close()
    conn = await connect(url)
    stored, copied = _Learner(), _Learner()

    async def store_batch() -> None:
        await write_lines(conn, stored.batch())

    async def copy_batch() -> None:
        # The per-job id is stood in for by seq: one writer, nothing to reserve.
        records = [
            (x.job_id, x.attempt, x.learner, x.stream.value, x.seq, x.seq, x.at, x.text)
            for x in copied.batch()
        ]
        await conn.copy_records_to_table("bench_raw_logs", records=records, columns=COLUMNS)

    try:
        # Halves alternated, so that drift in the machine's load hits both alike.
        store_s: list[float] = []
        copy_s: list[float] = []
        for _ in range(2):
            store_s += await _batches(seconds / 2, store_batch)
            copy_s += await _batches(seconds / 2, copy_batch)
        rows = await conn.fetchval("SELECT count(*) FROM job_logs")
    finally:
        await conn.close()
    if rows != stored.next_seq - 1:
        raise AssertionError(f"{stored.next_seq - 1} lines written, but {rows} stored")
    per_s = BATCH * len(store_s) / sum(store_s)
    raw_per_s = BATCH * len(copy_s) / sum(copy_s)
    return {
        "seconds": seconds,
        "batch_size": BATCH,
        "log_lines_per_s": round(per_s),
        "target_lines_per_s": TARGET_LINES_PER_S,
        "meets_target": per_s >= TARGET_LINES_PER_S,
        "batch_ms_p50": round(statistics.median(store_s) * 1000, 2),
        "batch_ms_max": round(max(store_s) * 1000, 2),
        "raw_copy_lines_per_s": round(raw_per_s),
        "ratio_vs_raw_copy": round(per_s / raw_per_s, 3),
    }


async def _batches(seconds: float, write: Callable[[], Awaitable[None]]) -> list[float]:
    """The duration of each batch written until the deadline (at least one)."""
    durations: list[float] = []
    deadline = time.perf_counter() + seconds
    while not durations or time.perf_counter() < deadline:
        start = time.perf_counter()
        await write()
        durations.append(time.perf_counter() - start)
    return durations


TENANTS = 8
"""Tenants of the kept log; the searched one (`acme`) holds SEARCHED_SHARE of its lines."""
SEARCHED_SHARE = 0.4
LINES_PER_JOB = 5000
SEARCH_PAGE = 100
PATTERNS: dict[str, tuple[str, bool, bool]] = {
    # name: (pattern, regex, ignore_case)
    "rare_substring": ("CUDA out of memory", False, False),
    "common_substring": ("loss", False, False),
    "rare_ignore_case": ("cuda OUT OF memory", False, True),
    "absent_substring": ("segmentation fault", False, False),
    "regex": ("grad_norm [0-9]+\\.9[0-9]+ ", True, False),
}

# One line of generated text: mostly training progress, with data loader, checkpoint, warning,
# validation and traceback lines, request ids (high variety), and a rare CUDA error (about one
# line in 200,000). `r` is the row's random draw, `g` its number in its job.
_LINE_SQL = """
CASE
    WHEN r < 0.55 THEN format('epoch %s step %s loss %s lr %s grad_norm %s throughput %s samples/s',
        g / 1000, g, round((1.0 / (1 + g / 100.0) + random() * 0.05)::numeric, 4),
        round((0.001 * random())::numeric, 6), round((random() * 3)::numeric, 3),
        round((1500 + random() * 500)::numeric, 1))
    WHEN r < 0.70 THEN format('[rank %s] dataloader worker %s prefetched batch %s in %s ms',
        (g % 8), (g % 4), g, round((random() * 40)::numeric, 2))
    WHEN r < 0.78 THEN format('validation accuracy %s top5 %s on %s samples',
        round(random()::numeric, 4), round(random()::numeric, 4), 10000 + g % 5000)
    WHEN r < 0.84 THEN format('INFO request %s served in %s ms by replica %s',
        md5(g::text || r::text), round((random() * 100)::numeric, 1), g % 16)
    WHEN r < 0.88 THEN format('checkpoint saved to /ckpt/%s/step-%s.pt (%s MiB)',
        substr(md5(job::text), 1, 8), g, 100 + g % 400)
    WHEN r < 0.92 THEN format('WARNING gradient overflow, scaling loss to %s', 2 ^ (g % 16))
    WHEN r < 0.96 THEN format('  File "/workspace/%s.py", line %s, in %s',
        (ARRAY['train', 'model', 'data', 'optim'])[1 + g % 4], g % 900,
        (ARRAY['forward', 'step', 'collate', 'backward', 'load'])[1 + g % 5])
    WHEN r < 0.999995 THEN format('%s: tokens %s, padding %s%%, shard %s of %s',
        (ARRAY['tokenizer', 'sampler', 'packer', 'augment'])[1 + g % 4], g * 7 % 9973,
        g % 100, g % 64, 64)
    ELSE format('RuntimeError: CUDA out of memory. Tried to allocate %s MiB (GPU %s)',
        20 + g % 2000, g % 8)
END
"""


async def run_search(
    url: str, *, lines: int, searches: int, seconds: float, database: str, progress: bool
) -> dict[str, Any]:
    """`trainyard bench logs`: fill (once) and search the kept log, and ingest into it."""
    from controlplane.database import create_pool, with_database
    from controlplane.migrate import migrate

    kept = with_database(url, database)
    admin = await connect(url, role=None)
    try:
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database):
            await admin.execute(f'CREATE DATABASE "{database}"')
    finally:
        await admin.close()
    await migrate(kept)
    fill_s = await _fill(kept, lines, progress)
    owner = await connect(kept, role=None)
    try:
        indexed = bool(
            await owner.fetchval("SELECT 1 FROM pg_class WHERE relname = 'job_log_search_trigrams'")
        )
        stored = await owner.fetchval("SELECT count(*) FROM job_logs")
        tenant_lines = await owner.fetchval("SELECT count(*) FROM job_logs WHERE tenant = 'acme'")
        jobs = await owner.fetchval("SELECT count(*) FROM job_log_heads")
    finally:
        await owner.close()
    pool = await create_pool(kept, min_size=1, max_size=2)
    try:
        found = await _searches(pool, searches, progress)
    finally:
        await pool.close()
    ingested = await _ingest(kept, seconds, progress)
    with_index, without_index = ingested["with"], ingested["without"]
    runs, written = await _sustained(kept, seconds, without_index, progress)
    queued = await _queued_search(kept, searches, progress, written)
    p95 = max(found[name]["p95_ms"] for name in ("rare_substring", "common_substring"))
    return {
        "lines": stored,
        "jobs": jobs,
        "tenants": TENANTS,
        "tenant_lines": tenant_lines,
        "trigram_index": indexed,
        "fill_s": fill_s,
        "search_page": SEARCH_PAGE,
        "search": found,
        "substring_p95_ms": p95,
        "target_substring_p95_ms": TARGET_SEARCH_P95_MS,
        "meets_search_target": p95 <= TARGET_SEARCH_P95_MS,
        "ingest_batch_size": BATCH,
        "ingest_lines_per_s_with_index": round(with_index),
        "ingest_lines_per_s_without_index": round(without_index),
        "ingest_ratio": round(with_index / without_index, 3),
        "target_lines_per_s": TARGET_LINES_PER_S,
        "meets_ingest_target": with_index >= TARGET_LINES_PER_S,
        "index_lines_per_s": round(ingested["index"]),
        "ingest_and_index_lines_per_s": round(1 / (1 / with_index + 1 / ingested["index"])),
        "cores": os.cpu_count(),
        "sustained_seconds": seconds,
        "sustained": runs,
        "sustained_meets_ingest_target": any(
            run["keeps_up"] and run["stored_lines_per_s"] >= TARGET_LINES_PER_S for run in runs
        ),
        "queued_search": queued,
    }


TARGET_SEARCH_P95_MS = 300


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"bench logs: {message}", file=sys.stderr, flush=True)


async def _fill(url: str, lines: int, progress: bool) -> float:
    """Fill the kept log with `lines` lines, unless a previous run did; the seconds it took."""
    owner = await connect(url, role=None)
    try:
        await owner.execute(
            "CREATE TABLE IF NOT EXISTS bench_logs_fill (lines bigint NOT NULL, fill_s float8)"
        )
        if await owner.fetchval("SELECT lines FROM bench_logs_fill") == lines:
            return 0.0
        start = time.perf_counter()
        await owner.execute(
            "TRUNCATE job_logs, job_log_heads, job_log_series, job_log_search,"
            " job_log_search_queue, bench_logs_fill"
        )
        # The search's indexes are built once after the fill (as migration 0035 does over an
        # existing log): much faster than the same work per row.
        definitions = await owner.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'job_log_search'"
            " AND indexname IN ('job_log_search_trigrams', 'job_log_search_order')"
        )
        for index in definitions:
            await owner.execute(f'DROP INDEX "{index["indexname"]}"')
        jobs = max(1, lines // LINES_PER_JOB)
        searched = round(jobs * SEARCHED_SHARE)
        await owner.execute(
            "CREATE TEMPORARY TABLE bench_jobs AS"
            " SELECT gen_random_uuid() AS job, n,"
            "  CASE WHEN n < $2 THEN 'acme' ELSE 'tenant-' || (n % $3) END AS tenant,"
            "  now() - interval '30 days' + n * (interval '30 days' / $1) AS start"
            " FROM generate_series(0, $1 - 1) AS n",
            jobs,
            searched,
            TENANTS - 1,
        )
        for first in range(0, jobs, 50):
            # Jobs' lines interleave in time: each job runs for two days, one line a ~35 ms.
            await owner.execute(
                f"""
                INSERT INTO job_logs (job_id, attempt, learner, stream, seq, id, at, line, tenant)
                SELECT job, 1 + g * 3 / ($3 + 1), g % 4,
                       CASE WHEN r < 0.96 THEN 'stdout' ELSE 'stderr' END,
                       g, g, start + g * (interval '2 days' / $3), {_LINE_SQL}, tenant
                FROM (SELECT job, start, tenant, g, random() AS r
                      FROM bench_jobs, generate_series(1, $3) AS g
                      WHERE n >= $1 AND n < $2) AS generated
                """,
                first,
                first + 50,
                lines // jobs,
            )
            _say(progress, f"filled {min(jobs, first + 50)} of {jobs} jobs")
        await owner.execute(
            "INSERT INTO job_log_heads (job_id, last_id, updated_at)"
            " SELECT job_id, max(id), max(at) FROM job_logs GROUP BY job_id"
        )
        # What the indexer would do over the queued fill, at once.
        await owner.execute(
            "INSERT INTO job_log_search (job_id, id, tenant, attempt, learner, stream, seq, at,"
            " line) SELECT job_id, id, tenant, attempt, learner, stream, seq, at, line"
            " FROM job_logs; TRUNCATE job_log_search_queue"
        )
        await owner.execute("SET maintenance_work_mem = '1GB'")
        for index in definitions:
            _say(progress, f"building {index['indexname']}")
            await owner.execute(index["indexdef"])
        await owner.execute("VACUUM ANALYZE job_logs, job_log_search")
        fill_s = round(time.perf_counter() - start, 1)
        await owner.execute("INSERT INTO bench_logs_fill VALUES ($1, $2)", lines, fill_s)
        return fill_s
    finally:
        await owner.close()


async def _searches(
    pool: asyncpg.Pool, searches: int, progress: bool, names: Sequence[str] = tuple(PATTERNS)
) -> dict[str, dict[str, float]]:
    found: dict[str, dict[str, float]] = {}
    for name in names:
        pattern, regex, ignore_case = PATTERNS[name]
        query = LogSearch(tenant="acme", pattern=pattern, regex=regex, ignore_case=ignore_case)
        await search(pool, query, limit=SEARCH_PAGE)  # warm the cache, as a user's second try
        durations = []
        shown = 0
        for _ in range(searches):
            start = time.perf_counter()
            shown = len(await search(pool, query, limit=SEARCH_PAGE))
            durations.append(time.perf_counter() - start)
        durations.sort()
        found[name] = {
            "p50_ms": round(statistics.median(durations) * 1000, 2),
            "p95_ms": round(durations[max(0, math.ceil(0.95 * len(durations)) - 1)] * 1000, 2),
            "lines": shown,
        }
        _say(progress, f"{name}: {found[name]}")
    return found


async def _ingest(url: str, seconds: float, progress: bool) -> dict[str, float]:
    """Lines stored per second as migration 0035 leaves the kept log ("with") and with no
    search on the writer's path ("without"), and lines indexed per second after each "with"
    half ("index"); halves alternated, each in a transaction that is rolled back."""
    conn = await connect(url, role=None)
    learner = _Learner()
    try:
        rates: dict[str, list[float]] = {"with": [], "without": [], "index": []}
        for _ in range(2):
            for with_index in (True, False):
                transaction = conn.transaction()
                await transaction.start()
                try:
                    # A tenant no search here reads: the rolled-back lines leave dead index
                    # entries behind, which would sit at the newest end of acme's lines.
                    await learner.register(conn, "ingest")
                    if not with_index:
                        await conn.execute("DROP TRIGGER job_logs_queue_for_search ON job_logs")

                    async def store_batch() -> None:
                        await write_lines(conn, learner.batch())

                    durations = await _batches(seconds / 2, store_batch)
                    if with_index:
                        start = time.perf_counter()
                        indexed = await index_queued_lines(conn, budget_s=math.inf)
                        index_s = time.perf_counter() - start
                        if indexed != BATCH * len(durations):
                            raise AssertionError(f"{indexed} lines indexed, not all written")
                        rates["index"].append(indexed / index_s)
                finally:
                    await transaction.rollback()
                name = "with" if with_index else "without"
                rates[name].append(BATCH * len(durations) / sum(durations))
                _say(progress, f"ingest {name} index: {rates[name][-1]:.0f}/s")
        _say(progress, f"indexer: {rates['index']} lines/s")
        return {name: statistics.mean(values) for name, values in rates.items()}
    finally:
        await conn.close()


SUSTAINED_INDEXERS = (1, 2)
KEEPS_UP = 0.95
"""The share of the stored lines the indexers must copy for the queue to count as bounded."""
DRAIN_LIMIT_S = 600
"""How long the indexers may take to empty the queue after a run before the benchmark fails."""


async def _sustained(
    url: str, seconds: float, without_index: float, progress: bool
) -> tuple[list[dict[str, Any]], list[uuid.UUID]]:
    """One writer and the control plane's indexers at once, for `seconds` each run (see the
    module's docstring); the runs' figures, and the jobs whose lines they committed."""
    from controlplane.database import create_pool

    owner = await connect(url, role=None)
    runs: list[dict[str, Any]] = []
    written: list[uuid.UUID] = []
    try:
        for count in SUSTAINED_INDEXERS:
            for rate in (None, TARGET_LINES_PER_S):
                learner = _Learner()
                await learner.register(owner, "ingest")
                written.append(learner.job_id)
                # Each run starts from an empty queue: what is left at its end is its own.
                await index_queued_lines(owner, budget_s=math.inf)
                pool = await create_pool(url, min_size=count, max_size=count)
                indexers = LogIndexers(pool, count=count)
                indexing = asyncio.create_task(indexers.run())
                try:
                    stored, elapsed = await _write(owner, learner, seconds, rate)
                    indexed = indexers.copied
                    queued = await _queued_lines(owner)
                    start = time.perf_counter()
                    async with asyncio.timeout(DRAIN_LIMIT_S):
                        await _drained(owner)
                    drain_s = time.perf_counter() - start
                finally:
                    indexers.stop()
                    await indexing
                    await pool.close()
                # Counted once every indexer has ended: the queue empties as a batch commits,
                # a moment before its indexer adds the batch to `copied`.
                if indexers.copied != stored:
                    raise AssertionError(f"{stored} lines stored, {indexers.copied} indexed")
                run = {
                    "indexers": count,
                    "writer": "flat_out" if rate is None else "at_target",
                    "stored_lines_per_s": round(stored / elapsed),
                    "indexed_lines_per_s": round(indexed / elapsed),
                    "queued_lines_end": queued,
                    "queue_growth_lines_per_s": round(queued / elapsed),
                    "keeps_up": indexed >= KEEPS_UP * stored,
                    "drain_s": round(drain_s, 2),
                    "stored_ratio_vs_without_index": round(stored / elapsed / without_index, 3),
                }
                runs.append(run)
                _say(progress, f"sustained: {run}")
    finally:
        await owner.close()
    return runs, written


async def _write(
    conn: asyncpg.Connection, learner: _Learner, seconds: float, rate: float | None
) -> tuple[int, float]:
    """Lines stored by `learner`'s batches for `seconds`, at most `rate` a second (None: as
    fast as it can), each committed; and the seconds it took."""
    stored = 0
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        if rate is not None and (ahead := start + stored / rate - now) > 0:
            await asyncio.sleep(ahead)
        stored += await write_lines(conn, learner.batch())
    return stored, time.perf_counter() - start


async def _drained(conn: asyncpg.Connection) -> None:
    """Return once the queue is empty (polled)."""
    while True:
        if not await _queued_lines(conn):
            return
        await asyncio.sleep(0.05)


async def _queued_lines(conn: asyncpg.Connection) -> int:
    lines: int = await conn.fetchval(
        "SELECT coalesce(sum(last_id - first_id + 1), 0)::bigint FROM job_log_search_queue"
    )
    return lines


TAIL_LINES = 50_000


async def _queued_search(
    url: str, searches: int, progress: bool, written: Sequence[uuid.UUID]
) -> dict[str, Any]:
    """Searches while TAIL_LINES committed lines of the searched tenant wait for the indexer;
    then the indexer's time to copy them. The lines are removed afterwards, with those of the
    jobs `written` (the sustained runs')."""
    from controlplane.database import create_pool

    learner = _Learner()
    owner = await connect(url, role=None)
    pool = await create_pool(url, min_size=1, max_size=2)
    try:
        await learner.register(owner, "acme")
        for _ in range(TAIL_LINES // BATCH):
            await write_lines(owner, learner.batch())
        queued = await owner.fetchval(
            "SELECT sum(last_id - first_id + 1)::bigint FROM job_log_search_queue"
            " WHERE job_id = $1",
            learner.job_id,
        )
        found = await _searches(pool, searches, progress, ("rare_substring", "common_substring"))
        start = time.perf_counter()
        await index_queued_lines(owner, budget_s=math.inf)
        index_s = time.perf_counter() - start
    finally:
        await pool.close()
        try:
            for table in (
                "job_log_search_queue",
                "job_log_search",
                "job_logs",
                "job_log_series",
                "job_log_heads",
                "job_status",
            ):
                await owner.execute(
                    f"DELETE FROM {table} WHERE job_id = ANY ($1)", [learner.job_id, *written]
                )
            # The removed lines' dead entries would slow the next run's first walk of acme's
            # newest lines.
            await owner.execute("VACUUM job_logs, job_log_search")
        finally:
            await owner.close()
    return {"queued_lines": queued, "search": found, "index_s": round(index_s, 2)}
