"""Reads of the searches read model for the API and the CLI: a tenant's searches, one search,
its trials, its best trial as a job manifest to run again."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from controlplane.jobs.manifest import HparamsSpec, JobManifest
from controlplane.queries import Q
from controlplane.searches.spec import SearchSpec, stored_spec

PAGE = 50
MAX_PAGE = 500


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
