"""Reads of an inference job for the API: its statistics, exact (computed by Postgres from every
recorded query, no buckets; audit.inference_queries re-derives them), its replicas, and its
queries' results in order; and the views the front ends answer with (`InferenceStats`,
`QueryPage`)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
from pydantic import BaseModel, Field

from controlplane.deployments.views import Instant
from controlplane.jobs.lifecycle import JobStatus
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


async def queries(pool: asyncpg.Pool, job_id: UUID, *, after: int, limit: int) -> list[QueryRecord]:
    """The job's queries after index `after`, in order, with their results."""
    rows = await pool.fetch(Q["list_queries"], job_id, after, limit)
    return [
        QueryRecord(
            index=row["index"],
            state=row["state"],
            replica=row["replica"],
            node=row["node"],
            tries=row["tries"],
            started_at=row["started_at"],
            claimed_at=row["claimed_at"],
            finished_at=row["finished_at"],
            latency_ms=row["latency_ms"],
            inference_ms=row["inference_ms"],
            outputs=None if row["output"] is None else json.loads(row["output"]),
            error=row["error"],
        )
        for row in rows
    ]


class QueryCounts(BaseModel):
    """Queries finished (succeeded or failed), running, queued (given back by a lost replica,
    to run again) and retried (run more than once; counted once)."""

    finished: int
    succeeded: int
    failed: int
    running: int
    queued: int
    retried: int


class InferenceRate(BaseModel):
    window_qps: float = Field(description="results in the last window_s")
    overall_qps: float = Field(description="results since the first query")


class QueryLatency(BaseModel):
    """Each finished query's time, claimed to recorded, over every one (exact), in ms."""

    mean: float | None
    std: float | None
    min: float | None
    median: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    max: float | None


class QueryRate(BaseModel):
    """IDunno's query rate: 1 / each finished query's time, in queries per second, over every
    one (exact)."""

    mean: float | None
    std: float | None
    median: float | None
    p90: float | None
    p95: float | None
    p99: float | None


class ReplicaStats(BaseModel):
    """A replica that asked for the job's queries, where it runs, and its figures."""

    replica: UUID
    node: str
    seen_at: Instant
    queries: QueryCounts
    rate: InferenceRate
    latency_ms: QueryLatency | None
    query_rate: QueryRate | None


class InferenceStats(BaseModel):
    """An inference job's figures, exact, and each replica's."""

    job_id: UUID
    state: JobStatus
    model: str | None = Field(description="tenant/name:version, resolved at submission")
    weight: float | None
    batch_size: int | None
    total_queries: int | None = Field(description="null: until cancelled")
    window_s: float
    queries: QueryCounts
    rate: InferenceRate
    latency_ms: QueryLatency | None
    query_rate: QueryRate | None
    replicas: list[ReplicaStats] = Field(
        description="the replicas that asked for its queries, where, and their figures"
    )


class QueryRecord(BaseModel):
    """One query of an inference job (a batch of its input) and its result."""

    index: int
    state: str
    replica: UUID
    node: str
    tries: int
    started_at: Instant
    claimed_at: Instant
    finished_at: Instant | None
    latency_ms: float | None
    inference_ms: float | None
    outputs: list[Any] | None = Field(description="one per item")
    error: str | None


class QueryPage(BaseModel):
    job_id: UUID
    queries: list[QueryRecord]
    next_after: int | None = Field(
        description="pass as `after` for more; null: this page is the last for now"
    )
