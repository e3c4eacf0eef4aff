"""Claiming queued jobs for a node: the claim, its GPU allocation, a fencing epoch and the
DEPLOYING event commit in one transaction, or not at all."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg
from opentelemetry import propagate

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.database import Executor
from controlplane.events.errors import ConcurrencyError
from controlplane.events.group_commit import GroupCommit
from controlplane.events.metadata import Metadata
from controlplane.events.records import StreamAppend
from controlplane.events.store import EventStore
from controlplane.instruments import CLAIM_LATENCY
from controlplane.jobs.events import JobEvent
from controlplane.jobs.lifecycle import Deploy, Job, JobStatus, Refused, decide, evolve
from controlplane.jobs.streams import job_stream
from controlplane.jobs.tracing import job_span
from controlplane.queries import Q
from controlplane.scheduling.claim import Claim
from controlplane.scheduling.claim_order import CLAIM_BATCH
from controlplane.scheduling.placement import Capacity, Demand, LearnerAllocation, place

log = logging.getLogger(__name__)

STALE_RETRIES = 5


class _Stale(Exception):
    """The queue rows were behind their jobs' streams, or the room counted on was taken; roll
    the claim back."""


async def claim(
    pool: asyncpg.Pool,
    store: EventStore,
    node: str,
    *,
    limit: int = CLAIM_BATCH,
    clock: Clock = SYSTEM_CLOCK,
    uids: range | None = None,
) -> list[Claim]:
    """Claim the next jobs that fit on `node` together, up to `limit` (for a job of several
    learners, on other nodes too); none when none fits. `uids`: each job claimed holds a
    learner uid (its own, or one of these allocated now), or waits in the queue until one is
    free; None: the node's learners run as its agent, and the jobs need none."""
    for _ in range(STALE_RETRIES):
        try:
            async with pool.acquire() as conn, conn.transaction():
                won = await _claim(conn, store, node, limit, clock, uids)
        except (
            _Stale,
            ConcurrencyError,
            asyncpg.UniqueViolationError,
            asyncpg.DeadlockDetectedError,
        ):
            # Other nodes claimed the jobs, or their users cancelled them, while the queue rows
            # (a projection) lagged; or another claim took some of the GPUs this one placed
            # learners on. All was rolled back; the next try sees the other claims.
            continue
        at = clock.now()
        for taken in won:
            latency = (at - queued_since(taken.job)).total_seconds()
            CLAIM_LATENCY.record(max(latency, 0.0), {"tenant": taken.job.tenant})
        return won
    return []


def queued_since(job: Job) -> datetime:
    """When a claimed job last became claimable: it entered QUEUED, or its restart backoff
    ended."""
    queued = [t.at for t in job.transitions if t.state is JobStatus.QUEUED]
    return max(queued[-1], job.not_before or queued[-1])


@dataclass(frozen=True, slots=True)
class _Placed:
    """A candidate, where its learners go, and its DEPLOYING event."""

    row: asyncpg.Record
    job: Job
    learners: list[LearnerAllocation]
    events: list[JobEvent]
    metadata: Metadata


def uids_exhausted(uids: range) -> str:
    """Why a job waits for a learner uid."""
    return (
        f"all {len(uids)} learner uids ({uids.start}:{len(uids)}, TRAINYARD_LEARNER_UIDS) are "
        "held by jobs whose folders are kept until their retention ends"
    )


async def _claim(
    conn: Executor, store: EventStore, node: str, limit: int, clock: Clock, uids: range | None
) -> list[Claim]:
    started = time.time_ns()
    rows = await conn.fetch(Q["claim_candidates"], node, limit)
    if not rows:
        return []  # nothing fits, or the node is not READY (deregistered, or declared lost)
    first = rows[0]
    # The view's memory is numeric (a bigint less a sum); placement counts whole MiB, and a
    # Decimal count of learners would not do for range().
    room = Capacity(
        node, list(first["free_gpus"]), first["free_cpus"], int(first["free_memory_mb"])
    )
    placed: list[_Placed] = []
    waiting: list[UUID] = []
    for row in rows:
        demand = Demand(
            row["learners"],
            row["gpus_per_learner"],
            row["cpus_per_learner"],
            row["memory_mb_per_learner"],
            row["learners_per_node"],
        )
        learners = place(demand, [room])
        if learners is None and placed:
            continue  # it fits the node alone, but not beside the jobs taken before it
        if learners is None:
            others = [
                Capacity(r["name"], list(r["gpus"]), r["cpus"], int(r["memory_mb"]))
                for r in await conn.fetch(Q["other_nodes_capacity"], node)
            ]
            learners = place(demand, [room, *others])
            if learners is None:
                # The queue counted room for it a moment ago, the same way: another claim took
                # some since. Roll back and look again.
                raise _Stale
        deployed = _deploy(row, node, learners, started, clock.now())
        if deployed is None:
            continue
        if uids is not None and not await _uid(conn, deployed.job.job_id, uids):
            waiting.append(deployed.job.job_id)
            continue
        placed.append(deployed)
        if any(learner.node != node for learner in learners):
            break  # placed on other nodes too: their room has changed; take no more now
        room = room.less(learners, demand)
    if uids is not None and waiting:
        # Not the jobs' fault: they stay queued, and are claimed once a uid is free.
        listed = ", ".join(map(str, waiting))
        log.error("node %s: job(s) %s wait: %s", node, listed, uids_exhausted(uids))
        if not placed:
            return []
    if not placed:
        raise _Stale  # every candidate's queue row was behind its job
    appended = await store.append_many(
        [
            StreamAppend(job_stream(p.job.job_id), p.row["version"], p.events, p.metadata)
            for p in placed
        ],
        conn=conn,
    )
    # A job whose stream moved on since its queue row was written (claimed by another node a
    # moment ago, cancelled) is left out; its row lock goes at commit.
    placed = [p for p, done in zip(placed, appended, strict=True) if done is not None]
    if not placed:
        raise _Stale
    await _allocate(conn, placed)
    return [_claimed(p) for p in placed]


def _deploy(
    row: asyncpg.Record, node: str, learners: list[LearnerAllocation], started: int, at: datetime
) -> _Placed | None:
    """The DEPLOYING event of a candidate placed on `learners`, in a `job.claim` span of its
    trace (from when the agent began looking until the event is decided); None when the job,
    as its queue row has it, cannot be deployed (the row is behind: leave the job out)."""
    job = Job.model_validate_json(row["doc"])
    allocated = [gpu for learner in learners for gpu in learner.gpus]
    nodes = list(dict.fromkeys(learner.node for learner in learners))
    attributes = {
        "trainyard.job.id": str(job.job_id),
        "trainyard.job.attempt": row["attempt"],
        "trainyard.node": node,
        "trainyard.nodes": nodes,
        "trainyard.gpus": allocated,
    }
    carrier = json.loads(row["trace"] or "{}")
    root = propagate.extract(carrier) if carrier else None
    with job_span("job.claim", root, attributes, start_time=started):
        try:
            deploy = Deploy(
                nodes=nodes,
                gpus=allocated,
                epoch=row["epoch"],
                at=at,
                learner_nodes=[learner.node for learner in learners],
            )
            events = decide(deploy, job)
        except Refused:
            return None
        metadata = Metadata.capture(f"agent:{node}", tenant=row["tenant"])
    return _Placed(row, job, learners, events, metadata)


async def _uid(conn: Executor, job_id: UUID, uids: range) -> bool:
    """Whether the job holds a learner uid, allocated from `uids` now if it had none. Before
    its DEPLOYING event: a job that gets none is left in the queue. Should the job then be left
    out as stale, its uid stays allocated in this transaction, and goes back at its retention's
    end like any other ended job's."""
    uid = await conn.fetchval(Q["allocate_learner_uid"], job_id, uids.start, len(uids))
    return uid is not None


async def _allocate(conn: Executor, placed: Sequence[_Placed]) -> None:
    """Every placed learner's allocation and GPUs, in one statement."""
    learners = [(p, learner) for p in placed for learner in p.learners]
    await conn.execute(
        Q["insert_allocations"],
        [p.job.job_id for p, _ in learners],
        [p.row["attempt"] for p, _ in learners],
        [learner.index for _, learner in learners],
        [p.row["tenant"] for p, _ in learners],
        [learner.node for _, learner in learners],
        [p.row["epoch"] for p, _ in learners],
        [p.row["cpus_per_learner"] for p, _ in learners],
        [p.row["memory_mb_per_learner"] for p, _ in learners],
        [gpu for _, learner in learners for gpu in learner.gpus],
        [k for k, (_, learner) in enumerate(learners, start=1) for _ in learner.gpus],
    )


def _claimed(placed: _Placed) -> Claim:
    deployed = placed.job
    for event in placed.events:
        deployed = evolve(deployed, event)
    return Claim(
        job=deployed,
        attempt=placed.row["attempt"],
        epoch=placed.row["epoch"],
        learners=placed.learners,
        version=placed.row["version"] + len(placed.events),
        trace=placed.metadata.trace,
    )


class Releases:
    """Gives back attempts' allocations on one node once their learners there have ended (their
    learners elsewhere are given back by their own nodes). A node's learners often end together:
    releases asked for while others are in flight go in one statement."""

    def __init__(self, pool: asyncpg.Pool, node: str) -> None:
        self._pool = pool
        self._node = node
        self._group: GroupCommit[tuple[UUID, int], None] = GroupCommit(
            self._release, key=lambda attempt: attempt
        )

    async def release(self, job_id: UUID, attempt: int) -> None:
        await self._group.submit((job_id, attempt))

    async def _release(self, attempts: list[tuple[UUID, int]]) -> list[None]:
        await self._pool.execute(
            Q["release_allocations"],
            [job_id for job_id, _ in attempts],
            [attempt for _, attempt in attempts],
            self._node,
        )
        return [None] * len(attempts)
