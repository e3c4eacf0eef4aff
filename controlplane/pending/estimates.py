"""When queued jobs should start: the running attempts give their room back when they are
expected to end, and the queue takes it in the policy's order, as claims would. Pure; an
estimate only where every end it waits for is known (a job's expected run time is what jobs
of its tenant and name took before: see the recorder's `pending_durations`)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from controlplane.pending.reasons import NodeRoom, Room
from controlplane.scheduling.claim_order import QueuedJob, TenantShare, total_gpus

ESTIMATED = 100
"""Only the first jobs of the queue get an estimate: further back, it would say little and
cost a walk of the queue for every end before theirs."""
STEPS = 2000
"""The most instants (ends, backoffs' ends) it looks at."""


@dataclass(frozen=True, slots=True)
class Holding:
    """A running learner's room on its node, until `ends` (None: not known)."""

    tenant: str
    node: str
    gpus: tuple[str, ...]
    cpus: float
    memory_mb: int
    ends: datetime | None


def estimated_in_order(
    nodes: Sequence[NodeRoom],
    tenants: Sequence[TenantShare],
    ordered: Sequence[QueuedJob],
    running: Sequence[Holding],
    expected: Mapping[UUID, timedelta],
    *,
    now: datetime,
) -> dict[UUID, datetime]:
    """The queued jobs (of the first ESTIMATED) that would start by the known ends, and when,
    of a queue already in the policy's order (`reasons.queue_order`); `expected`: the queued
    jobs' own run times, where known (their room comes back then)."""
    quotas = {tenant.name: tenant.gpu_quota for tenant in tenants}
    held = {tenant.name: tenant.held for tenant in tenants}
    room = Room(node.free for node in nodes)
    pushed = itertools.count()
    """Ties in time go in the order they were pushed: the estimate is deterministic."""
    instants: list[tuple[datetime, int, Holding | None]] = []
    for holding in running:
        # One past its expected end has shown that its end is not known after all.
        if holding.ends is not None and holding.ends > now:
            heapq.heappush(instants, (holding.ends, next(pushed), holding))
    waiting = [job for job in ordered if not job.allocated][:ESTIMATED]
    for job in waiting:
        if job.not_before is not None and job.not_before > now:
            heapq.heappush(instants, (job.not_before, next(pushed), None))
    starts: dict[UUID, datetime] = {}
    at = now
    for _ in range(STEPS):
        for job in waiting:
            if job.not_before is not None and job.not_before > at:
                continue
            gpus = total_gpus(job.demand)
            quota = quotas.get(job.tenant)
            if quota is not None and held.get(job.tenant, 0) + gpus > quota:
                continue
            learners = room.take(job.demand)
            if learners is None:
                continue
            starts[job.job_id] = at
            held[job.tenant] = held.get(job.tenant, 0) + gpus
            if job.job_id in expected:
                for learner in learners:
                    back = Holding(
                        job.tenant,
                        learner.node,
                        tuple(learner.gpus),
                        job.demand.cpus,
                        job.demand.memory_mb,
                        at + expected[job.job_id],
                    )
                    heapq.heappush(instants, (back.ends or at, next(pushed), back))
        waiting = [job for job in waiting if job.job_id not in starts]
        if not waiting or not instants:
            break
        at, _, ended = heapq.heappop(instants)
        if ended is not None:
            room.give(ended.node, ended.gpus, ended.cpus, ended.memory_mb)
            held[ended.tenant] = held.get(ended.tenant, 0) - len(ended.gpus)
    return starts
