"""Claiming queued jobs for a node: the claim, its GPU allocation, a fencing epoch and the
DEPLOYING event commit in one transaction, or not at all."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

import asyncpg
from opentelemetry import propagate

from controlplane.database import Executor
from controlplane.events.errors import ConcurrencyError
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.instruments import CLAIM_LATENCY
from controlplane.jobs.lifecycle import Deploy, Job, JobStatus, Refused, decide, evolve
from controlplane.jobs.service import now
from controlplane.jobs.streams import job_stream
from controlplane.jobs.tracing import job_span
from controlplane.queries import Q


@dataclass(frozen=True, slots=True)
class LearnerAllocation:
    index: int
    node: str
    gpus: list[str]


@dataclass(frozen=True, slots=True)
class Claim:
    """A job attempt placed on nodes: its learners' nodes and GPUs, and the fencing epoch."""

    job: Job
    attempt: int
    epoch: int
    learners: list[LearnerAllocation]
    version: int
    """The job stream's version once the claim's event is in."""
    trace: dict[str, str] = field(default_factory=dict)
    """The claim's span (in the job's trace), for the attempt's spans to continue; empty for
    an attempt an agent took over (after a restart, or placed on it by another node's claim),
    whose spans then start a trace of their own."""

    @property
    def gpus(self) -> list[str]:
        return [gpu for learner in self.learners for gpu in learner.gpus]

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(learner.node for learner in self.learners))

    def on(self, node: str) -> list[LearnerAllocation]:
        """The learners that `node` runs."""
        return [learner for learner in self.learners if learner.node == node]


@dataclass(frozen=True, slots=True)
class Capacity:
    """What a node can still give."""

    node: str
    gpus: list[str]
    cpus: float
    memory_mb: int


@dataclass(frozen=True, slots=True)
class Demand:
    """What each learner of a job needs."""

    learners: int
    gpus: int
    cpus: float
    memory_mb: int


def place(demand: Demand, nodes: Sequence[Capacity]) -> list[LearnerAllocation] | None:
    """Learners on nodes, in order (the claiming node first): each node takes as many as fit.
    None when they do not all fit: a job is placed whole or not at all."""
    placed: list[LearnerAllocation] = []
    for node in nodes:
        fits = min(
            len(node.gpus) // demand.gpus if demand.gpus else demand.learners,
            int(node.cpus // demand.cpus),
            node.memory_mb // demand.memory_mb,
            demand.learners - len(placed),
        )
        for k in range(max(fits, 0)):
            gpus = node.gpus[k * demand.gpus : (k + 1) * demand.gpus]
            placed.append(LearnerAllocation(len(placed), node.node, gpus))
    return placed if len(placed) == demand.learners else None


STALE_RETRIES = 5


class _Stale(Exception):
    """The queue row was behind the job's stream, or the room it counted on was taken; roll
    the claim back."""


async def claim(pool: asyncpg.Pool, store: EventStore, node: str) -> Claim | None:
    """Claim the next job that fits on `node` (and, for a job of several learners, on other
    nodes too), or None when none fits."""
    for _ in range(STALE_RETRIES):
        try:
            async with pool.acquire() as conn, conn.transaction():
                won = await _claim(conn, store, node)
        except (
            _Stale,
            ConcurrencyError,
            asyncpg.UniqueViolationError,
            asyncpg.DeadlockDetectedError,
        ):
            # Another node claimed the job, or its user cancelled it, while the queue row (a
            # projection) lagged; or another claim took some of the GPUs this one placed
            # learners on. All was rolled back; the next try sees the other claim.
            continue
        if won is not None:
            latency = (now() - queued_since(won.job)).total_seconds()
            CLAIM_LATENCY.record(max(latency, 0.0), {"tenant": won.job.tenant})
        return won
    return None


def queued_since(job: Job) -> datetime:
    """When a claimed job last became claimable: it entered QUEUED, or its restart backoff
    ended."""
    queued = [t.at for t in job.transitions if t.state is JobStatus.QUEUED]
    return max(queued[-1], job.not_before or queued[-1])


async def _claim(conn: Executor, store: EventStore, node: str) -> Claim | None:
    started = time.time_ns()
    row = await conn.fetchrow(Q["claim_candidate"], node)
    if row is None:
        return None  # nothing fits, or the node is not READY (deregistered, or declared lost)
    job_id: UUID = row["job_id"]
    # The job as the queue (a projection) has it, at its stream version: if the stream has
    # moved on since (cancelled, say), the append below refuses, and nothing is claimed.
    job = Job.model_validate_json(row["doc"])
    epoch = int(row["epoch"])
    demand = Demand(
        row["learners"],
        row["gpus_per_learner"],
        row["cpus_per_learner"],
        row["memory_mb_per_learner"],
    )
    here = Capacity(node, list(row["free_gpus"]), row["free_cpus"], row["free_memory_mb"])
    learners = place(demand, [here])
    if learners is None:
        others = [
            Capacity(r["name"], list(r["gpus"]), r["cpus"], r["memory_mb"])
            for r in await conn.fetch(Q["other_nodes_capacity"], node)
        ]
        learners = place(demand, [here, *others])
        if learners is None:
            # The queue counted room for it a moment ago, the same way: another claim took
            # some since. Roll back and look again.
            raise _Stale
    allocated = [g for learner in learners for g in learner.gpus]
    nodes = list(dict.fromkeys(learner.node for learner in learners))
    attributes = {
        "trainyard.job.id": str(job_id),
        "trainyard.job.attempt": row["attempt"],
        "trainyard.node": node,
        "trainyard.nodes": nodes,
        "trainyard.gpus": allocated,
    }
    # The span starts when the agent began looking; which job's trace it joins shows only now.
    root = propagate.extract(json.loads(row["trace"] or "{}"))
    with job_span("job.claim", root, attributes, start_time=started):
        try:
            events = decide(Deploy(nodes=nodes, gpus=allocated, epoch=epoch, at=now()), job)
        except Refused as exc:
            raise _Stale from exc
        metadata = Metadata.capture(f"agent:{node}", tenant=row["tenant"])
        await store.append(job_stream(job_id), row["version"], events, metadata, conn=conn)
        await conn.execute(
            Q["insert_allocations"],
            job_id,
            row["attempt"],
            row["tenant"],
            epoch,
            [learner.index for learner in learners],
            [learner.node for learner in learners],
            allocated,
            demand.gpus,
            demand.cpus,
            demand.memory_mb,
        )
    deployed = job
    for event in events:
        deployed = evolve(deployed, event)
    return Claim(
        job=deployed,
        attempt=row["attempt"],
        epoch=epoch,
        learners=learners,
        version=row["version"] + len(events),
        trace=metadata.trace,
    )


async def release(pool: asyncpg.Pool, job_id: UUID, attempt: int, node: str) -> None:
    """Give back an attempt's allocations on `node` once its learners there have ended."""
    await pool.execute(Q["release_allocations"], job_id, attempt, node)
