"""Read-model queries over the jobs' status view, and the views of a job its readers get (the
API, the dashboard, the CLI)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
from pydantic import BaseModel, ConfigDict, Field

from controlplane.jobs.lifecycle import Job, JobStatus
from controlplane.jobs.ranks import Rank, ranks
from controlplane.queries import Q
from controlplane.webhooks.deliveries import Delivery


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


def _ranks(fields: dict[str, Any]) -> list[Rank]:
    # The view's fields validated so far: the job's, which need no validating again.
    return ranks(Job.model_construct(**fields))


class JobView(Job):
    """A job as its readers see it: the job, its id as `id`, why a queued job can never fit
    on any live node as they stand (None for views of the past, and for jobs not QUEUED), and
    its ranks."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    job_id: UUID = Field(alias="id")
    unschedulable_reason: str | None = Field(
        description="why a queued job can never fit on any live node as they stand"
    )
    ranks: list[Rank] = Field(
        default_factory=_ranks,
        description="each learner of the current attempt as torch.distributed numbers it "
        "(RANK is the learner index; log lines name their learner): its node, GPUs, state "
        "and exit code",
    )


class JobPage(BaseModel):
    jobs: list[JobView]
    next_cursor: str | None = Field(
        description="where the next page starts (send it as ?cursor=); null on the last page"
    )
    total: int = Field(description="how many jobs the filters match in all (every page says it)")


class HistoryEntry(BaseModel):
    """One event of a job, with the state it left the job in."""

    version: int
    position: int
    event: str
    state: JobStatus
    attempt: int
    at: datetime
    actor: str
    reason: str | None


class JobHistory(BaseModel):
    id: UUID
    history: list[HistoryEntry]
    webhooks: list[Delivery] = Field(
        description="every attempt to deliver the job's notifications, in the order they ended "
        "(from the stream webhook-<job_id>)"
    )
