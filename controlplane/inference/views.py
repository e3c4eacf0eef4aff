"""Reads of an inference job for the API: its statistics, exact (computed by Postgres from every
recorded query, no buckets; audit.inference_queries re-derives them), its replicas, and its
queries' results in order."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from controlplane.queries import Q

WINDOW_S = 10.0
"""The sliding window of the rate (`rate.window_qps`)."""


async def stats(pool: asyncpg.Pool, job_id: UUID, *, window_s: float = WINDOW_S) -> dict[str, Any]:
    """The job's figures, and each replica's: counts, rates, latency."""
    rows = await pool.fetch(Q["query_stats"], job_id, window_s)
    present = await pool.fetch(Q["inference_replicas"], job_id)
    overall = next((row for row in rows if row["replica"] is None), None)
    replicas = {row["replica"]: row for row in rows if row["replica"] is not None}
    return {
        "window_s": window_s,
        **figures(overall, window_s),
        "replicas": [
            {
                "replica": str(seen["replica"]),
                "node": seen["node"],
                "seen_at": seen["seen_at"].isoformat(),
                **figures(replicas.get(seen["replica"]), window_s),
            }
            for seen in present
        ],
    }


def figures(row: asyncpg.Record | None, window_s: float) -> dict[str, Any]:
    """One row of `query_stats` as the API shows it (zeros for a job without queries)."""
    if row is None or (row["finished"] == 0 and row["running"] == 0 and row["queued"] == 0):
        return {
            "queries": _counts(row),
            "rate": {"window_qps": 0.0, "overall_qps": 0.0},
            "latency_ms": None,
            "query_rate": None,
        }
    first: datetime | None = row["first_started_at"]
    last: datetime | None = row["last_finished_at"]
    span_s = (last - first).total_seconds() if first and last else 0.0
    latency = query_rate = None
    if row["finished"]:
        p50, p90, p95, p99 = row["percentiles_ms"]
        latency = {
            "mean": row["mean_ms"],
            "std": row["std_ms"],
            "min": row["min_ms"],
            "median": p50,
            "p90": p90,
            "p95": p95,
            "p99": p99,
            "max": row["max_ms"],
        }
        r50, r90, r95, r99 = row["rate_percentiles"]
        query_rate = {
            "mean": row["rate_mean"],
            "std": row["rate_std"],
            "median": r50,
            "p90": r90,
            "p95": r95,
            "p99": r99,
        }
    # A job younger than the window has had only its age to record results in.
    window = min(window_s, (row["at"] - first).total_seconds()) if first else window_s
    return {
        "queries": _counts(row),
        "rate": {
            "window_qps": row["in_window"] / window if window > 0 else 0.0,
            "overall_qps": row["finished"] / span_s if span_s > 0 else 0.0,
        },
        "latency_ms": latency,
        "query_rate": query_rate,
    }


def _counts(row: asyncpg.Record | None) -> dict[str, int]:
    names = ("finished", "succeeded", "failed", "running", "queued", "retried")
    return {name: 0 if row is None else row[name] for name in names}


async def queries(
    pool: asyncpg.Pool, job_id: UUID, *, after: int, limit: int
) -> list[dict[str, Any]]:
    """The job's queries after index `after`, in order, with their results."""
    rows = await pool.fetch(Q["list_queries"], job_id, after, limit)
    return [
        {
            "index": row["index"],
            "state": row["state"],
            "replica": str(row["replica"]),
            "node": row["node"],
            "tries": row["tries"],
            "started_at": row["started_at"].isoformat(),
            "claimed_at": row["claimed_at"].isoformat(),
            "finished_at": None if row["finished_at"] is None else row["finished_at"].isoformat(),
            "latency_ms": row["latency_ms"],
            "inference_ms": row["inference_ms"],
            "outputs": None if row["output"] is None else json.loads(row["output"]),
            "error": row["error"],
        }
        for row in rows
    ]
