"""Claiming queued jobs for a node: the claim, its GPU allocation, a fencing epoch and the
DEPLOYING event commit in one transaction, or not at all."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
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
    gpus: list[str]


@dataclass(frozen=True, slots=True)
class Claim:
    """A job attempt this node now runs: its learners' GPUs and the fencing epoch."""

    job: Job
    attempt: int
    epoch: int
    learners: list[LearnerAllocation]
    version: int
    """The job stream's version once the claim's event is in."""
    trace: dict[str, str]
    """The claim's span (in the job's trace), for the attempt's spans to continue."""

    @property
    def gpus(self) -> list[str]:
        return [gpu for learner in self.learners for gpu in learner.gpus]


STALE_RETRIES = 5


class _Stale(Exception):
    """The queue row was behind the job's stream; roll the claim back."""


async def claim(pool: asyncpg.Pool, store: EventStore, node: str) -> Claim | None:
    """Claim the next job that fits on `node`, or None when none fits."""
    for _ in range(STALE_RETRIES):
        try:
            async with pool.acquire() as conn, conn.transaction():
                won = await _claim(conn, store, node)
        except (_Stale, ConcurrencyError):
            # Another node claimed the job, or its user cancelled it, while the queue row (a
            # projection) lagged; all was rolled back. The next try sees the other claim's
            # allocation (or the projection's update) and takes the next job.
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
    free = await conn.fetchrow(Q["node_free"], node)
    if free is None:
        return None  # the node is not READY (deregistered, or declared lost)
    gpus: list[str] = list(free["gpus"])
    row = await conn.fetchrow(Q["claim_candidate"], len(gpus), free["cpus"], free["memory_mb"])
    if row is None:
        return None
    job_id: UUID = row["job_id"]
    # The job as the queue (a projection) has it, at its stream version: if the stream has
    # moved on since (cancelled, say), the append below refuses, and nothing is claimed.
    job = Job.model_validate_json(row["doc"])
    epoch = int(row["epoch"])
    per_learner = row["gpus_per_learner"]
    learners = [
        LearnerAllocation(i, gpus[i * per_learner : (i + 1) * per_learner])
        for i in range(row["learners"])
    ]
    allocated = [g for learner in learners for g in learner.gpus]
    attributes = {
        "trainyard.job.id": str(job_id),
        "trainyard.job.attempt": row["attempt"],
        "trainyard.node": node,
        "trainyard.gpus": allocated,
    }
    # The span starts when the agent began looking; which job's trace it joins shows only now.
    root = propagate.extract(json.loads(row["trace"] or "{}"))
    with job_span("job.claim", root, attributes, start_time=started):
        try:
            events = decide(Deploy(nodes=[node], gpus=allocated, epoch=epoch, at=now()), job)
        except Refused as exc:
            raise _Stale from exc
        metadata = Metadata.capture(f"agent:{node}", tenant=row["tenant"])
        await store.append(job_stream(job_id), row["version"], events, metadata, conn=conn)
        await conn.execute(
            Q["insert_allocations"],
            job_id,
            row["attempt"],
            row["tenant"],
            node,
            epoch,
            allocated,
            per_learner,
            row["learners"],
            row["cpus_per_learner"],
            row["memory_mb_per_learner"],
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


async def release(pool: asyncpg.Pool, job_id: UUID, attempt: int) -> None:
    """Give back an attempt's allocations once all its learners have ended."""
    await pool.execute(Q["release_allocations"], job_id, attempt)
