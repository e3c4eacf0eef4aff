"""Reads of the searches read model for the API and the CLI: a tenant's searches, one search,
its trials, its trials' metric curves, its best trial as a job manifest to run again."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import asyncpg
from pydantic import BaseModel, Field, field_serializer

from controlplane.instants import Instant
from controlplane.jobs.manifest import HparamsSpec, JobManifest
from controlplane.queries import Q
from controlplane.searches.lifecycle import State, trial_job_id
from controlplane.searches.spec import SearchSpec, stored_spec
from controlplane.searches.trials import Mode, TrialState
from runners import protocol

PAGE = 50
MAX_PAGE = 500
CURVE_POINTS = 100
"""Points per trial's curve unless asked: a chart a thousand trials wide shows no more."""
MAX_CURVE_POINTS = 1000
MAX_CURVE_TRIALS = 1000
"""Trials per response: 1,000 curves of 1,000 points are some 20 MB of JSON at most."""


SearcherName = Literal["random", "grid", "asha", "evolution"]


class MetricOf(BaseModel):
    name: str
    mode: Mode


class Best(BaseModel):
    """The best trial at the highest rung any trial reached."""

    trial: int
    rung: int
    metric: float


class SearchView(BaseModel):
    """A search as its readers see it (from the read model, which lags its stream a moment)."""

    id: UUID
    tenant: str
    name: str
    state: State
    searcher: SearcherName
    metric: MetricOf
    max_trials: int
    trials: int = Field(description="trials created so far")
    best: Best | None = Field(description="the best trial at the highest rung any trial reached")
    reason: str | None = Field(description="why it ended")
    labels: dict[str, str]
    created_at: Instant | None
    updated_at: Instant | None
    ended_at: Instant | None


class SearchDetail(SearchView):
    spec: SearchSpec = Field(description="as submitted")


class SearchPage(BaseModel):
    searches: list[SearchView]
    next_cursor: str | None = Field(
        description="where the next page starts (send it as ?cursor=); null on the last page"
    )
    total: int = Field(description="how many searches match in all")


class SearchCreated(BaseModel):
    """A search just submitted (or found again by its Idempotency-Key)."""

    id: UUID
    tenant: str
    name: str
    state: State
    trials: int = Field(description="trials created so far")


class SearchCancelled(BaseModel):
    id: UUID
    state: State


class RungResult(BaseModel):
    rung: int
    metric: float


class TrialView(BaseModel):
    number: int
    job_id: UUID = Field(description="the job of its latest rung")
    rung: int
    budget: int = Field(description="steps or epochs it trains to at its rung")
    state: TrialState
    hparams: dict[str, Any]
    results: list[RungResult]
    metric: float | None
    parent: int | None = Field(description="mutated from (evolution)")
    reason: str = Field(description="the searcher's latest decision's reason")
    created_at: Instant | None
    updated_at: Instant | None


class TrialList(BaseModel):
    trials: list[TrialView] = Field(description="by number")


class TrialCurve(BaseModel):
    number: int
    rung: int = Field(description="the highest rung it reached")
    state: TrialState
    jobs: list[UUID] = Field(description="its jobs, one per rung it reached, rung 0 first")
    reported: int = Field(description="how many reports of the metric its curve was thinned from")
    points: list[tuple[int, float | str]] = Field(
        description='[step, value] by step; a non-finite value as a string ("inf")'
    )


class CurvePage(BaseModel):
    metric: str
    mode: Mode | None = Field(description="the search's mode, when it is its metric")
    trials: list[TrialCurve]
    next_after: int | None = Field(description="`after` for the next page; null: no more")


class BestMetric(BaseModel):
    name: str
    mode: Mode
    value: float


class BestTrial(BaseModel):
    """The best trial so far, and the job that trains its model again."""

    trial: int
    rung: int
    metric: BestMetric
    hparams: dict[str, Any]
    job_id: UUID
    manifest: JobManifest = Field(
        description="the template with the trial's hyperparameters and the whole budget "
        "(fields at their defaults left out): submit it with POST /v1/jobs"
    )

    @field_serializer("manifest")
    def _as_written(self, manifest: JobManifest) -> dict[str, Any]:
        return manifest.model_dump(mode="json", exclude_defaults=True)


def search_view(row: asyncpg.Record) -> SearchView:
    return SearchView.model_validate(_search(row))


def search_detail(row: asyncpg.Record) -> SearchDetail:
    # As stored: a search submitted before today's floors reads within them.
    spec = SearchSpec.model_validate(stored_spec(json.loads(row["spec"])))
    return SearchDetail.model_validate({**_search(row), "spec": spec})


def _search(row: asyncpg.Record) -> dict[str, Any]:
    best = None
    if row["best_trial"] is not None:
        best = {"trial": row["best_trial"], "rung": row["best_rung"], "metric": row["best_metric"]}
    return {
        "id": row["search_id"],
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
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "ended_at": row["ended_at"],
    }


def trial_view(row: asyncpg.Record) -> TrialView:
    return TrialView(
        number=row["number"],
        job_id=row["job_id"],
        rung=row["rung"],
        budget=row["budget"],
        state=row["state"],
        hparams=json.loads(row["point"]),
        results=[RungResult(rung=r, metric=m) for r, m in json.loads(row["results"])],
        metric=row["metric"],
        parent=row["parent"],
        reason=row["reason"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


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


async def trials(pool: asyncpg.Pool, search_id: UUID) -> list[TrialView]:
    return [trial_view(row) for row in await pool.fetch(Q["search_trials"], search_id)]


def best_manifest(row: asyncpg.Record, trial: TrialView) -> JobManifest:
    """The search's trial template with `trial`'s hyperparameters and the whole budget: the job
    that trains the best trial's model again, as a user may submit it."""
    # As stored: a search submitted before today's floors reads within them.
    spec = SearchSpec.model_validate(stored_spec(json.loads(row["spec"])))
    hparams = HparamsSpec(values=trial.hparams, budget=spec.budget.max, unit=spec.budget.unit)
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
) -> list[TrialCurve]:
    """A page of the search's trials (numbered above `after`; those in `only` when given), each
    with its jobs (one per rung it reached) and its curve of `metric`: (step, value) by step,
    thinned to about `points`, from the lowest-numbered learner that reported it. A step
    reported again (by a restarted attempt, or by a promoted rung resuming from a checkpoint)
    shows its latest value."""
    rows = await pool.fetch(
        Q["search_curve_trials"], search_id, after, None if only is None else list(only), limit
    )
    jobs_of: dict[int, list[UUID]] = {}
    job_ids: list[UUID] = []
    numbers: list[int] = []
    rungs: list[int] = []
    for row in rows:
        jobs = [trial_job_id(search_id, row["number"], rung) for rung in range(row["rung"] + 1)]
        jobs_of[row["number"]] = jobs
        job_ids += jobs
        numbers += [row["number"]] * len(jobs)
        rungs += range(len(jobs))
    reported: dict[int, int] = {}
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
        reported[number] = row["total"]
        steps.setdefault(number, {})[report.step] = report.values[metric]
    return [
        TrialCurve(
            number=row["number"],
            rung=row["rung"],
            state=row["state"],
            jobs=jobs_of[row["number"]],
            reported=reported.get(row["number"], 0),
            points=[
                # JSON has no NaN or infinity (a diverging loss): they are sent as strings.
                (step, value if math.isfinite(value) else str(value))
                for step, value in sorted(steps.get(row["number"], {}).items())
            ],
        )
        for row in rows
    ]
