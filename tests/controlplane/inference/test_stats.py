"""An inference job's statistics are exact: computed from every recorded query, equal to the
figures recomputed here from the rows, and re-derivable from `audit.inference_queries`."""

from __future__ import annotations

import math
import statistics
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from controlplane.database import create_pool
from controlplane.inference.views import stats

T0 = datetime.now(UTC) - timedelta(days=1)
"""Long enough ago that no result falls in the sliding window."""
REPLICAS = (uuid.uuid4(), uuid.uuid4())
# Query times in ms, chosen uneven (a long tail), alternating replicas and nodes.
TIMES_MS = [120.0, 80.0, 95.5, 400.0, 101.25, 99.0, 87.0, 1300.0, 110.0, 90.0, 105.0]


def percentile(ordered: list[float], fraction: float) -> float:
    """Linear between the two nearest ranks (Postgres's percentile_cont)."""
    at = fraction * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


async def seed(conn: asyncpg.Connection) -> uuid.UUID:
    job = uuid.uuid4()
    await conn.execute(
        "INSERT INTO inference_jobs (job_id, tenant, deployment, weight, batch_size, queries,"
        " input, started, created_at) VALUES ($1, 'acme', 'inference-x', 1, 4, NULL,"
        ' \'{"generate": {"shape": [4]}}\', $2, $3)',
        job,
        len(TIMES_MS) + 2,
        T0,
    )
    for index, ms in enumerate(TIMES_MS):
        claimed = T0 + timedelta(seconds=index)
        await conn.execute(
            "INSERT INTO inference_queries (job_id, index, state, replica, node, tries,"
            " started_at, claimed_at, finished_at, output) VALUES ($1, $2, 'succeeded', $3, $4,"
            " $5, $6, $6, $7, '[1]')",
            job,
            index,
            REPLICAS[index % 2],
            f"n{index % 2 + 1}",
            1 + (index == 3),
            claimed,
            claimed + timedelta(milliseconds=ms),
        )
    # One running and one given back: counted, not in the times.
    for index, state in ((len(TIMES_MS), "running"), (len(TIMES_MS) + 1, "queued")):
        await conn.execute(
            "INSERT INTO inference_queries (job_id, index, state, replica, node, tries,"
            " started_at, claimed_at) VALUES ($1, $2, $3, $4, 'n1', 1, $5, $5)",
            job,
            index,
            state,
            REPLICAS[0],
            T0 + timedelta(seconds=index),
        )
    for n, replica in enumerate(REPLICAS):
        await conn.execute(
            "INSERT INTO inference_replicas (job_id, replica, node, seen_at) VALUES ($1, $2, $3,"
            " $4)",
            job,
            replica,
            f"n{n + 1}",
            T0,
        )
    return job


def expected(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "mean": statistics.fmean(times),
        "std": statistics.pstdev(times),
        "min": ordered[0],
        "median": percentile(ordered, 0.5),
        "p90": percentile(ordered, 0.9),
        "p95": percentile(ordered, 0.95),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1],
    }


def close(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-9) for k in a)


async def test_figures_equal_those_recomputed_from_every_query(db_url: str) -> None:
    pool = await create_pool(db_url, min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            job = await seed(conn)
        figures = await stats(pool, job)
    finally:
        await pool.close()
    assert figures["queries"] == {
        "finished": len(TIMES_MS),
        "succeeded": len(TIMES_MS),
        "failed": 0,
        "running": 1,
        "queued": 1,
        "retried": 1,
    }
    assert close(figures["latency_ms"], expected(TIMES_MS))
    rates = [1000 / ms for ms in TIMES_MS]
    idunno = {k: v for k, v in expected(rates).items() if k not in ("min", "max")}
    assert close(figures["query_rate"], idunno)
    span_s = (len(TIMES_MS) - 1) + TIMES_MS[-1] / 1000  # first claimed to last recorded
    assert math.isclose(figures["rate"]["overall_qps"], len(TIMES_MS) / span_s)
    assert figures["rate"]["window_qps"] == 0  # all recorded long before now
    by_replica = {r["replica"]: r for r in figures["replicas"]}
    for n, replica in enumerate(REPLICAS):
        mine = TIMES_MS[n::2]
        row = by_replica[str(replica)]
        assert row["node"] == f"n{n + 1}"
        assert row["queries"]["finished"] == len(mine)
        assert close(row["latency_ms"], expected(mine))


async def test_the_audit_view_re_derives_them(db_url: str) -> None:
    owner = await asyncpg.connect(db_url)
    try:
        job = await seed(owner)
        rows = await owner.fetch(
            "SELECT latency_ms FROM audit.inference_queries WHERE job_id = $1"
            " AND finished_at IS NOT NULL ORDER BY index",
            job,
        )
        sql = await owner.fetchrow(
            "SELECT avg(latency_ms) AS mean, stddev_pop(latency_ms) AS std,"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_ms) AS p99"
            " FROM audit.inference_queries WHERE job_id = $1 AND finished_at IS NOT NULL",
            job,
        )
    finally:
        await owner.close()
    assert [row["latency_ms"] for row in rows] == TIMES_MS
    want = expected(TIMES_MS)
    assert math.isclose(sql["mean"], want["mean"])
    assert math.isclose(sql["std"], want["std"])
    assert math.isclose(sql["p99"], want["p99"])
