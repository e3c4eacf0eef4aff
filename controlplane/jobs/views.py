"""Read-model queries over the jobs' status view: what the API, a dashboard or the CLI lists."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from uuid import UUID

import asyncpg

from controlplane.jobs.lifecycle import Job, JobStatus
from controlplane.queries import Q


async def list_jobs(
    pool: asyncpg.Pool,
    *,
    tenant: str | None,
    states: Sequence[JobStatus] = (),
    labels: Mapping[str, str] | None = None,
    after: tuple[datetime, UUID] | None = None,
    limit: int,
) -> tuple[list[Job], int]:
    """Jobs newest first (by submission time, then id): one tenant's (None: everyone's), in
    any of `states` (none: every state), carrying all of `labels`, after the job whose
    submission time and id are `after`; at most `limit`. And how many match in all (every
    page: in one snapshot with the page)."""
    after_time, after_id = after if after is not None else (None, None)
    pairs = dict(labels or {})
    filters = (tenant, [state.value for state in states] or None, json.dumps(pairs))
    # The counters hold the jobs by one label pair at most; more pairs are counted job by job.
    count = Q["count_jobs"] if len(pairs) <= 1 else Q["count_jobs_by_labels"]
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        await conn.execute(Q["plan_per_call"])
        rows = await conn.fetch(Q["list_jobs"], *filters, after_time, after_id, limit)
        total: int = await conn.fetchval(count, *filters)
    return [Job.model_validate_json(row["doc"]) for row in rows], total
