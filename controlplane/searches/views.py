"""Reads of the searches read model for the API and the CLI: a tenant's searches, one search,
its trials, its trials' metric curves, its best trial as a job manifest to run again."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from controlplane.jobs.manifest import HparamsSpec, JobManifest
from controlplane.queries import Q
from controlplane.searches.lifecycle import trial_job_id
from controlplane.searches.spec import SearchSpec, stored_spec
from runners import protocol

PAGE = 50
MAX_PAGE = 500
CURVE_POINTS = 100
"""Points per trial's curve unless asked: a chart a thousand trials wide shows no more."""
MAX_CURVE_POINTS = 1000
MAX_CURVE_TRIALS = 1000
"""Trials per response: 1,000 curves of 1,000 points are some 20 MB of JSON at most."""


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def search_view(row: asyncpg.Record) -> dict[str, Any]:
    best = None
    if row["best_trial"] is not None:
        best = {"trial": row["best_trial"], "rung": row["best_rung"], "metric": row["best_metric"]}
    return {
        "id": str(row["search_id"]),
        "tenant": row["tenant"],
        "name": row["name"],
        "state": row["state"],
        "searcher": row["searcher"],
        "metric": {"name": row["metric"], "mode": row["mode"]},
        "max_trials": row["max_trials"],
        "trials": row["trials"],
        "best": best,
        "reason": row["reason"],
        "labels": json.loads(row["labels"]),
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
        "ended_at": _iso(row["ended_at"]),
    }


def trial_view(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "number": row["number"],
        "job_id": str(row["job_id"]),
        "rung": row["rung"],
        "budget": row["budget"],
        "state": row["state"],
        "hparams": json.loads(row["point"]),
        "results": [{"rung": r, "metric": m} for r, m in json.loads(row["results"])],
        "metric": row["metric"],
        "parent": row["parent"],
        "reason": row["reason"],
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
    }


async def search_row(pool: asyncpg.Pool, search_id: UUID) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await pool.fetchrow(Q["search_row"], search_id)
    return row


async def list_searches(
    pool: asyncpg.Pool,
    tenant: str | None,
    state: str | None,
    after: tuple[datetime, UUID] | None,
    limit: int,
) -> tuple[list[asyncpg.Record], int]:
    """A page of searches, newest first, after the cursor (the last one of the page before),
    and how many match in all (in one snapshot with the page)."""
    created, search_id = after if after is not None else (None, None)
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        rows = await conn.fetch(Q["list_searches"], tenant, state, created, search_id, limit)
        total: int = await conn.fetchval(Q["count_searches"], tenant, state)
    return rows, total


async def trials(pool: asyncpg.Pool, search_id: UUID) -> list[dict[str, Any]]:
    return [trial_view(row) for row in await pool.fetch(Q["search_trials"], search_id)]


def best_manifest(row: asyncpg.Record, trial: dict[str, Any]) -> JobManifest:
    """The search's trial template with `trial`'s hyperparameters and the whole budget: the job
    that trains the best trial's model again, as a user may submit it."""
    # As stored: a search submitted before today's floors reads within them.
    spec = SearchSpec.model_validate(stored_spec(json.loads(row["spec"])))
    hparams = HparamsSpec(values=trial["hparams"], budget=spec.budget.max, unit=spec.budget.unit)
    return spec.trial.model_copy(update={"name": f"{spec.name[:100]}-best", "hparams": hparams})


async def curves(
    pool: asyncpg.Pool,
    search_id: UUID,
    metric: str,
    *,
    after: int,
    only: Sequence[int] | None,
    limit: int,
    points: int,
) -> list[dict[str, Any]]:
    """A page of the search's trials (numbered above `after`; those in `only` when given), each
    with its jobs (one per rung it reached) and its curve of `metric`: (step, value) by step,
    thinned to about `points`, from the lowest-numbered learner that reported it. A step
    reported again (by a restarted attempt, or by a promoted rung resuming from a checkpoint)
    shows its latest value."""
    rows = await pool.fetch(
        Q["search_curve_trials"], search_id, after, None if only is None else list(only), limit
    )
    page = []
    job_ids: list[UUID] = []
    numbers: list[int] = []
    rungs: list[int] = []
    for row in rows:
        jobs = [trial_job_id(search_id, row["number"], rung) for rung in range(row["rung"] + 1)]
        job_ids += jobs
        numbers += [row["number"]] * len(jobs)
        rungs += range(len(jobs))
        page.append(
            {
                "number": row["number"],
                "rung": row["rung"],
                "state": row["state"],
                "jobs": [str(job) for job in jobs],
                "reported": 0,
                "points": [],
            }
        )
    by_number = {trial["number"]: trial for trial in page}
    learner_of: dict[int, int] = {}
    steps: dict[int, dict[int, float]] = {}
    needle = json.dumps(metric) + ":"
    for row in await pool.fetch(Q["search_trial_curves"], job_ids, numbers, rungs, needle, points):
        number = row["number"]
        # Learners of one job report the same steps: the first one's curve stands for the job.
        if learner_of.setdefault(number, row["learner"]) != row["learner"]:
            continue
        report = protocol.parse(row["line"])
        if not isinstance(report, protocol.Metric) or metric not in report.values:
            continue
        by_number[number]["reported"] = row["total"]
        steps.setdefault(number, {})[report.step] = report.values[metric]
    for number, values in steps.items():
        by_number[number]["points"] = [
            # JSON has no NaN or infinity (a diverging loss): they are sent as strings.
            [step, value if math.isfinite(value) else str(value)]
            for step, value in sorted(values.items())
        ]
    return page
