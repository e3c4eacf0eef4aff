"""Reads of the serving read models for the API: a tenant's deployments, its replicas' jobs,
a deployment's figures (exact, over the tasks and batches kept; re-derivable with SQL); and the
views its front ends answer with (deployments, pipelines, figures, tasks)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

import asyncpg
from pydantic import BaseModel, Field, PlainSerializer, WithJsonSchema

from controlplane.deployments.spec import Autoscaling, CanaryRollback
from controlplane.queries import Q


async def list_deployments(pool: asyncpg.Pool, tenant: str) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await pool.fetch(Q["list_deployments"], tenant)
    return rows


async def replica_states(pool: asyncpg.Pool, job_ids: Sequence[UUID]) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await pool.fetch(Q["replica_states"], list(job_ids))
    return rows


async def figures(pool: asyncpg.Pool, tenant: str, name: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await pool.fetchrow(Q["deployment_figures"], tenant, name)
    return row


def _isoformat(when: datetime) -> str:
    return when.isoformat()


Instant = Annotated[
    datetime,
    PlainSerializer(_isoformat, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
"""An instant as the serving views have always written it: Python's ISO 8601 (+00:00, not Z)."""


def _absent(value: object) -> bool:
    return value is None


def _sometimes(description: str | None = None) -> Any:
    """A key only some views have: left out of them rather than written as null."""
    return Field(default=None, exclude_if=_absent, description=description)


class ReplicaJob(BaseModel):
    job_id: UUID
    state: str
    attempt: int


class CanaryView(BaseModel):
    """Another version of its model beside it: its share of the requests and its replicas."""

    model: str = Field(description="tenant/name:version, resolved when it started")
    reference: str = Field(description="the model reference as given")
    version: int
    artifact_sha256: str
    weight: int = Field(description="percent of requests it gets; the rest go to `version`")
    replicas: int = Field(description="its replicas asked for")
    rollback: CanaryRollback | None = Field(
        description="when it rolls back by itself (null: only by command)"
    )
    replica_jobs: list[ReplicaJob] = Field(description="its jobs serving now")
    started_at: Instant


class DeploymentView(BaseModel):
    """A deployment, its replicas' jobs and how it stands."""

    name: str
    tenant: str
    model: str = Field(description="tenant/name:version, resolved at deploy")
    reference: str = Field(description="the model reference as given")
    version: int
    artifact_sha256: str
    entry_point: str
    replicas: int = Field(description="replicas asked for (by its owner, or by its autoscaling)")
    resources: dict[str, Any]
    serving: dict[str, Any]
    autoscaling: Autoscaling | None = Field(
        description="the bounds its replicas follow the load within (null: a fixed number)"
    )
    state: Literal["serving", "deleting"]
    replica_jobs: list[ReplicaJob] = Field(
        description="the jobs serving it now (see GET /v1/jobs/{id})"
    )
    failures: int = Field(description="replicas retired in a row because their job FAILED")
    inference_job: UUID | None = Field(
        description="the inference job that owns it (its replicas run that job's queries; "
        "cancel the job to stop them)"
    )
    next_replica_at: Instant | None = Field(
        description="after failures in a row, when a replica is started again (null: at once)"
    )
    canary: CanaryView | None = Field(
        default=None,
        description="another version beside it, taking its `weight` of the requests (null: "
        "every request to `version`)",
    )
    created_at: Instant
    updated_at: Instant


class DeploymentHistoryEntry(BaseModel):
    """One event of a deployment: created, scaled (by its owner), autoscaled (with the load
    that drove it), a replica started or retired (and why), deleted."""

    version: int = Field(description="in the deployment's stream")
    position: int
    event: str
    at: Instant
    actor: str
    data: dict[str, Any]


class DeploymentHistory(BaseModel):
    tenant: str
    name: str
    history: list[DeploymentHistoryEntry]
    next_after: int | None = Field(
        description="the `after` of the next page; null: this page is the last"
    )


class DeploymentSummary(BaseModel):
    name: str
    model: str = Field(description="tenant/name:version, resolved at deploy")
    replicas: int = Field(description="replicas asked for")
    replica_jobs: int = Field(description="how many jobs serve it now")
    state: Literal["serving", "deleting"]
    created_at: Instant


class DeploymentList(BaseModel):
    items: list[DeploymentSummary]


class PipelineView(BaseModel):
    name: str
    tenant: str
    steps: list[str]
    created_at: Instant


class Quantiles(BaseModel):
    p50: float | None
    p99: float | None


class MemoFigures(BaseModel):
    hits: int
    misses: int
    entries: int


class BatchFigures(BaseModel):
    count: int
    items: int
    mean_size: float | None
    max_size: int
    full: int
    timeout: int
    idle: int
    """Left with what was there, its replica having no call in flight (the direct path)."""
    invocation_ms: Quantiles
    inference_ms: Quantiles


class DeploymentFigures(BaseModel):
    """Over the tasks and batches kept (24 hours)."""

    deployment: str
    requests: int
    succeeded: int
    failed: int
    queue_depth: int
    running: int
    memo: MemoFigures
    latency_ms: Quantiles
    batches: BatchFigures


class TaskTimes(BaseModel):
    """DLHub's three times: request (submitted to finished), invocation (the agent's call of the
    replica, each step summed), inference (the model's own)."""

    request_ms: float | None
    invocation_ms: float | None
    inference_ms: float | None
    steps: list[dict[str, Any]]


TaskStatus = Literal["queued", "running", "succeeded", "failed"]


class TaskView(BaseModel):
    """A prediction's task: its state, result and times."""

    task_id: UUID
    status: TaskStatus
    items: int
    memo: Literal["hit", "miss", "off"] = Field(
        description="hit: answered from the memo, without a replica; off: not memoized"
    )
    tries: int
    submitted_at: Instant
    finished_at: Instant | None
    times: TaskTimes
    deployment: str | None = _sometimes()
    pipeline: str | None = _sometimes()
    step: int | None = _sometimes("a pipeline's step it is at (from 0)")
    outputs: list[Any] | None = _sometimes("one per input item (succeeded only)")
    error: str | None = _sometimes("why it failed: a traceback of the model's")

    @property
    def finished(self) -> bool:
        return self.status in ("succeeded", "failed")


class QueuedTask(BaseModel):
    """A task queued, not yet answered: read it at its Location."""

    task_id: UUID
    status: Literal["queued"] = "queued"
    items: int


def task_view(row: asyncpg.Record) -> TaskView:
    """A task as the API shows it: its state, result, and DLHub's three times."""
    steps = (
        json.loads(row["step_times"]) if isinstance(row["step_times"], str) else row["step_times"]
    )
    finished: datetime | None = row["finished_at"]
    submitted: datetime = row["submitted_at"]
    where: dict[str, Any] = (
        {"deployment": row["steps"][0]}
        if row["pipeline"] is None
        else {"pipeline": row["pipeline"], "step": row["step"]}
    )
    return TaskView(
        task_id=row["task_id"],
        status=row["state"],
        items=row["items"],
        memo=row["memo"],
        tries=row["tries"],
        submitted_at=submitted,
        finished_at=finished,
        times=TaskTimes(
            request_ms=None if finished is None else (finished - submitted).total_seconds() * 1000,
            invocation_ms=sum(s["invocation_ms"] for s in steps) if steps else None,
            inference_ms=sum(s["inference_ms"] or 0.0 for s in steps) if steps else None,
            steps=steps,
        ),
        outputs=json.loads(row["output"]) if row["state"] == "succeeded" else None,
        error=row["error"],
        **where,
    )
