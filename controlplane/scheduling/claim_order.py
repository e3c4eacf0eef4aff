"""The order a claim takes queued jobs in, stated in Python under a `ClaimPolicy`: what the
`claim_candidates` SQL does under the same policy (it reads the policy's row in the claim
statement itself), clause by clause. The SQL stays the production path (one statement, on every
job's critical path); this statement is what the simulator and the pending-reasons work reason
with, and a property test (tests/controlplane/scheduling/test_claim_order.py) holds the two to
the same jobs in the same order under every policy.

Under fair share (the default): the tenant holding the fewest GPUs for its weight first
(counting the jobs before it in this list as held), then priority (highest first), then
submission time, then job id. Under priority: priority, submission time and id across tenants.
Under fifo: submission time and id alone. Within each tenant's GPU quota unless the policy
turns quotas off; each tenant offers only as many jobs as could fit, as the SQL's per-tenant
scan does. What it leaves out is concurrency: the SQL skips the rows other claims hold locked,
which here are simply absent from the queue."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from controlplane.scheduling.placement import Capacity, Demand, fitting, node_takes
from controlplane.scheduling.policy import DEFAULT, ClaimPolicy, Order

CLAIM_BATCH = 8
"""The most jobs one claim takes: a node with room for several takes them in one transaction
(agents/claims.py; the simulator claims alike)."""


@dataclass(frozen=True, slots=True)
class TenantShare:
    """A tenant as the claim weighs it: its fair-share weight, its GPU quota (None: none), and
    the GPUs its live allocations hold."""

    name: str
    weight: float
    gpu_quota: int | None
    held: int


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A QUEUED job's current attempt as the queue row has it."""

    job_id: UUID
    tenant: str
    demand: Demand
    priority: int
    submitted_at: datetime
    not_before: datetime | None
    """When its restart backoff ends; None when it has none."""
    allocated: bool = False
    """Its attempt has allocations already: claimed, but the queue row does not say so yet."""


def claim_order(
    node: str,
    ready: Sequence[Capacity],
    tenants: Sequence[TenantShare],
    queue: Sequence[QueuedJob],
    *,
    limit: int,
    now: datetime,
    policy: ClaimPolicy = DEFAULT,
) -> list[QueuedJob]:
    """Up to `limit` queued jobs that `node` could take, in the order its claim takes them.
    `ready` is what every READY node can still give; a node not among them takes nothing."""
    here = next((room for room in ready if room.node == node), None)
    if here is None:
        return []
    # Each tenant offers no more jobs than could fit together (GPU jobs: one a free GPU), so
    # that jobs this claim cannot take stay free for other nodes.
    per_tenant = min(limit, max(len(here.gpus), 1))
    own_order = order_key(policy.order)
    ranked: list[tuple[float, QueuedJob]] = []
    for tenant in shares(tenants, policy):
        own = sorted(
            (
                job
                for job in queue
                if job.tenant == tenant.name
                and not job.allocated
                and (job.not_before is None or job.not_before <= now)
                and fits(job.demand, here, ready)
                and within_quota(tenant, tenant.held + total_gpus(job.demand))
            ),
            key=own_order,
        )[:per_tenant]
        taken = 0
        for job in own:
            taken += total_gpus(job.demand)
            if within_quota(tenant, tenant.held + taken):
                # The tenant's share just before this job: what it holds and the jobs before it.
                ranked.append(((tenant.held + taken - total_gpus(job.demand)) / tenant.weight, job))
    ranked.sort(key=rank_key(policy.order))
    return [job for _, job in ranked[:limit]]


def shares(tenants: Sequence[TenantShare], policy: ClaimPolicy) -> list[TenantShare]:
    """The tenants as the policy weighs them: without their quotas where it turns quotas off."""
    return [t if policy.quotas else replace(t, gpu_quota=None) for t in tenants]


def fits(demand: Demand, here: Capacity, ready: Sequence[Capacity]) -> bool:
    """Whether a job could go to the claiming node `here`: all of it fits there, or, with
    several learners, one learner fits there and the READY nodes (`here` among them) together
    have room for every learner, counted node by node. With `per_node`, each node takes that
    many learners or none (`node_takes`): `here` must take them, and the READY nodes together
    all of them."""
    if demand.per_node is not None:
        return node_takes(demand, fitting(demand, here, demand.learners)) > 0 and (
            demand.learners
            <= sum(node_takes(demand, fitting(demand, room, demand.learners)) for room in ready)
        )
    whole = (
        demand.learners * demand.gpus <= len(here.gpus)
        and demand.learners * demand.cpus <= here.cpus
        and demand.learners * demand.memory_mb <= here.memory_mb
    )
    if whole:
        return True
    return (
        demand.learners > 1
        and demand.gpus <= len(here.gpus)
        and demand.cpus <= here.cpus
        and demand.memory_mb <= here.memory_mb
        # As the SQL counts: floor(cpus / per learner) rather than Python's `//` on floats; no
        # more than the job has (the node's count stops mattering there).
        and demand.learners <= sum(fitting(demand, room, demand.learners) for room in ready)
    )


def within_quota(tenant: TenantShare, gpus: int) -> bool:
    """Whether the tenant may hold `gpus` GPUs in all."""
    return tenant.gpu_quota is None or gpus <= tenant.gpu_quota


def total_gpus(demand: Demand) -> int:
    """The GPUs a job holds, over all its learners."""
    return demand.learners * demand.gpus


def tenant_order(job: QueuedJob) -> tuple[int, datetime, UUID]:
    """Priority (highest first), then submission time, then job id: uuids compare as
    Postgres compares them, byte by byte."""
    return (-job.priority, job.submitted_at, job.job_id)


def fifo_order(job: QueuedJob) -> tuple[datetime, UUID]:
    """Submission time, then job id."""
    return (job.submitted_at, job.job_id)


def order_key(order: Order) -> Callable[[QueuedJob], tuple[Any, ...]]:
    """The order of a tenant's own queued jobs under `order` (and of all jobs, where it is not
    fair share)."""
    return fifo_order if order is Order.FIFO else tenant_order


def rank_key(order: Order) -> Callable[[tuple[float, QueuedJob]], tuple[Any, ...]]:
    """The order of jobs across tenants under `order`, each job with its tenant's share just
    before it (what the tenant holds and its jobs before this one, for its weight): the share
    first under fair share, then the tenants' own order; the own order alone otherwise."""
    if order is Order.FAIR_SHARE:
        return lambda entry: (entry[0], *tenant_order(entry[1]))
    own = order_key(order)
    return lambda entry: own(entry[1])
