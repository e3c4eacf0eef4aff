"""Claiming queued jobs for a node: the claim, its GPU allocation, a fencing epoch and the
DEPLOYING event commit in one transaction, or not at all."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import asyncpg

from controlplane.database import Executor
from controlplane.events.errors import ConcurrencyError
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.lifecycle import Deploy, Job, Refused, decide, evolve
from controlplane.jobs.service import now
from controlplane.jobs.streams import job_stream
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
                return await _claim(conn, store, node)
        except (_Stale, ConcurrencyError):
            # Another node claimed the job, or its user cancelled it, while the queue row (a
            # projection) lagged; all was rolled back. The next try sees the other claim's
            # allocation (or the projection's update) and takes the next job.
            continue
    return None


async def _claim(conn: Executor, store: EventStore, node: str) -> Claim | None:
    row = await conn.fetchrow(Q["claim_candidate"], node)
    if row is None:
        return None  # nothing fits, or the node is not READY (deregistered, or declared lost)
    gpus: list[str] = list(row["free_gpus"])
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
    )


async def release(pool: asyncpg.Pool, job_id: UUID, attempt: int) -> None:
    """Give back an attempt's allocations once all its learners have ended."""
    await pool.execute(Q["release_allocations"], job_id, attempt)
