"""The value types the port itself adds: what the agent reads back from the control plane's
tables, as plain values (never a database's records); and the claim's records it speaks of.
Pure: no database driver (an agent's reconcile planner imports only these)."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from controlplane.jobs.events import JobEvent
from controlplane.scheduling.claim import Claim
from controlplane.scheduling.placement import LearnerAllocation

__all__ = [
    "Allocation",
    "BatchCall",
    "Claim",
    "ClaimedTask",
    "ExpiredFolders",
    "InferenceJob",
    "JobNews",
    "LearnerAllocation",
    "QueryClaim",
    "TaskResults",
    "WarmUid",
]


@dataclass(frozen=True, slots=True)
class Allocation:
    """One learner's live allocation on a node."""

    job_id: UUID
    attempt: int
    learner: int
    node: str
    epoch: int
    gpus: list[str]


@dataclass(frozen=True, slots=True)
class JobNews:
    """An event of a job's stream, at its version: what the agent carries to its learners."""

    version: int
    event: JobEvent


@dataclass(frozen=True, slots=True)
class ExpiredFolders:
    """A job whose retention has ended, whose folders a node still keeps."""

    job_id: UUID
    uid: int | None
    checkpoints: UUID
    """The job whose checkpoint folder it used (itself, or an earlier rung of its trial)."""
    checkpoints_used: bool
    """Whether a job that has not expired still uses that checkpoint folder."""


@dataclass(frozen=True, slots=True)
class WarmUid:
    """A learner uid a node holds for a warm sandbox, under a placeholder (a job id of no job)
    until the job that gets the sandbox adopts it."""

    placeholder: UUID
    uid: int


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """A deployment's task taken under a batch's claim."""

    task_id: UUID
    items: int
    input: str
    """Its inputs, as JSON text."""
    age_ms: float
    """How long it had been queued when first claimed."""


@dataclass(frozen=True, slots=True)
class BatchCall:
    """One call of a replica's entry point, recorded as a batch."""

    items: int
    invocation_ms: float
    inference_ms: float | None


@dataclass(frozen=True, slots=True)
class TaskResults:
    """What a replica answered for a batch's tasks, recorded under the batch's claim."""

    claim: UUID
    task_ids: list[UUID]
    outputs: list[str | None]
    errors: list[str | None]
    tenant: str
    deployment: str
    replica: UUID
    items: int
    reason: str
    """Why the batch left: 'full' or 'timeout'."""
    invocation_ms: float
    inference_ms: float | None
    calls: tuple[BatchCall, ...] = ()
    """Each call of the entry point, when the batch took several (a task larger than
    max_batch_size is run in calls of at most that many items): each is recorded as a batch of
    its own. None given: one call, of the figures above."""


@dataclass(frozen=True, slots=True)
class InferenceJob:
    """An inference job's source of items and how many make one query."""

    input: str
    """Its source, as JSON text: {"items": [...]} or {"generate": ...}."""
    batch_size: int


@dataclass(frozen=True, slots=True)
class QueryClaim:
    index: int | None
    outcome: str
    """'claimed', 'wait' or 'done' (controlplane/inference/queries.sql)."""
