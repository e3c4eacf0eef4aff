"""Why each queued job waits: every reason that applies, each with its detail, and its place in
the queue. Pure, over a snapshot of the cluster, so that the recorder (`recorder`) and the
tests judge the same way.

The queue's order is the claim policy's over the whole cluster (`claim_order` states it for one
claiming node): under fair share, the tenants' shares first, then priority, then submission
time; under priority or fifo, as those orders say. Walking that order, each
job that could run now takes its room, as the next claims would, and the jobs after it see what
is left: a job is held back by the jobs ahead only where they take the room it needs. Reasons
come in two kinds, as Kueue separates them: those of a job that will never run as it is
(`never`: it fits no live node, or exceeds its tenant's quota alone) and those of a job that
waits for something that will change (`waiting`)."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from controlplane.scheduling.claim_order import (
    QueuedJob,
    TenantShare,
    fits,
    order_key,
    rank_key,
    total_gpus,
    within_quota,
)
from controlplane.scheduling.placement import Capacity, Demand, LearnerAllocation, place
from controlplane.scheduling.policy import Order
from controlplane.scheduling.unschedulable import LiveNodes, unschedulable_reason


class Reason(StrEnum):
    NO_NODES = "no_nodes"
    UNSCHEDULABLE = "unschedulable"
    GPU_UNHEALTHY = "gpu_unhealthy"
    QUOTA = "quota"
    BACKOFF = "backoff"
    RESOURCES = "resources"
    FAIR_SHARE = "fair_share"
    PRIORITY = "priority"
    STARTING = "starting"
    """Nothing holds it back: the next claim takes it (or took it, and its deployment is
    being recorded)."""
    REPLICAS = "replicas"
    """An inference job: it needs no node itself, and waits for its replicas' first query."""


class Blocking(StrEnum):
    NEVER = "never"
    """It will never run as it is: the cluster, the job or the tenant's quota must change."""
    WAITING = "waiting"
    """It waits for something that changes by itself (room, its turn, a backoff's end)."""


@dataclass(frozen=True, slots=True)
class Pending:
    reason: Reason
    blocking: Blocking
    detail: str


@dataclass(frozen=True, slots=True)
class NodeRoom:
    """A READY node: what it can still give, and what it has in all."""

    free: Capacity
    gpus: int
    """Its healthy GPUs."""
    unhealthy: int
    cpus: float
    memory_mb: int


@dataclass(frozen=True, slots=True)
class Assessment:
    job_id: UUID
    position: int
    """1 for the job the policy takes first, counting every queued job."""
    reasons: tuple[Pending, ...]


def queue_order(
    tenants: Sequence[TenantShare], queue: Iterable[QueuedJob], order: Order = Order.FAIR_SHARE
) -> list[QueuedJob]:
    """Every queued job, in the order the policy takes them cluster-wide. Under fair share: by
    the tenant's share just before the job (what it holds and its jobs before this one, for its
    weight), then priority, submission time and id, jobs of a tenant not in `tenants` last;
    under priority or fifo, by that order alone."""
    own: dict[str, list[QueuedJob]] = defaultdict(list)
    for job in queue:
        own[job.tenant].append(job)
    ranked: list[tuple[float, QueuedJob]] = []
    own_order = order_key(order)
    for tenant in tenants:
        taken = 0
        for job in sorted(own.pop(tenant.name, []), key=own_order):
            ranked.append(((tenant.held + taken) / tenant.weight, job))
            taken += total_gpus(job.demand)
    ranked.extend((float("inf"), job) for job in itertools.chain(*own.values()))
    ranked.sort(key=rank_key(order))
    return [job for _, job in ranked]


def assess(
    nodes: Sequence[NodeRoom],
    tenants: Sequence[TenantShare],
    queue: Sequence[QueuedJob],
    *,
    now: datetime,
    order: Order = Order.FAIR_SHARE,
) -> list[Assessment]:
    """Every queued job's reasons (at least one each), in the queue's order under the policy's
    `order` (`tenants` as the policy weighs them: without quotas where it turns them off)."""
    walk = Walk(nodes, tenants, now=now, order=order)
    ahead = walk.start()
    return [
        walk.step(ahead, job, position)
        for position, job in enumerate(queue_order(tenants, queue, order), start=1)
    ]


@dataclass(slots=True)
class Ahead:
    """What the jobs walked so far leave to the jobs after them: a walk's state between two
    jobs, from which it can go on (see `resume`)."""

    room: Room
    starting: Counter[str]
    """GPUs of the jobs this walk lets start, by tenant: held as soon as they are claimed."""
    jobs: int
    """The jobs ahead that may run (now or once room frees), in all, ..."""
    of_tenant: defaultdict[str, Counter[int]]
    """... and by tenant and priority, ..."""
    by_priority: Counter[int]
    """... and by priority."""

    def copy(self) -> Ahead:
        return Ahead(
            self.room.copy(),
            Counter(self.starting),
            self.jobs,
            defaultdict(Counter, {t: Counter(c) for t, c in self.of_tenant.items()}),
            Counter(self.by_priority),
        )


class Walk:
    """The walk of `assess` over one cluster, tenants, instant and order: each job is judged
    from what the jobs ahead of it leave (`Ahead`), and leaves the rest to the jobs after it."""

    def __init__(
        self,
        nodes: Sequence[NodeRoom],
        tenants: Sequence[TenantShare],
        *,
        now: datetime,
        order: Order,
    ) -> None:
        self._nodes = nodes
        self._shares = {tenant.name: tenant for tenant in tenants}
        self._healthy = _live(nodes, counting_unhealthy=False)
        self._whole = _live(nodes, counting_unhealthy=True)
        self._now = now
        self._order = order
        self._shorts: dict[tuple[Demand, tuple[int, float, int]], Pending] = {}
        """`_short`'s reason by demand and the room's most: once the cluster is full, the
        thousands of jobs behind share a handful of them, and each took a third of its step
        (its text made anew) in a round with 6,000 queued."""

    def start(self) -> Ahead:
        """Nothing walked yet: every READY node's free room."""
        return Ahead(
            Room(node.free for node in self._nodes), Counter(), 0, defaultdict(Counter), Counter()
        )

    def step(self, ahead: Ahead, job: QueuedJob, position: int) -> Assessment:
        """The reasons of `job`, at `position`, after the jobs `ahead` (which it then joins)."""
        tenant = self._shares.get(job.tenant, TenantShare(job.tenant, 1.0, None, 0))
        if job.allocated:
            reasons = [_starting("claimed: its deployment is being recorded")]
        else:
            reasons = _held(
                job, tenant, ahead.starting[tenant.name], self._healthy, self._whole, self._now
            )
        if not reasons:
            if ahead.room.take(job.demand) is not None:
                ahead.starting[tenant.name] += total_gpus(job.demand)
                reasons = [_starting("a READY node has room: the next claim takes it")]
            else:
                key = (job.demand, ahead.room.most)
                short = self._shorts.get(key)
                if short is None:
                    short = self._shorts[key] = _short(*key)
                reasons = [short]
                reasons += _behind(
                    job,
                    tenant,
                    ahead.jobs,
                    ahead.of_tenant[tenant.name],
                    ahead.by_priority,
                    self._order,
                )
            ahead.jobs += 1
            ahead.of_tenant[tenant.name][job.priority] += 1
            ahead.by_priority[job.priority] += 1
        return Assessment(job.job_id, position, tuple(reasons))


def _held(
    job: QueuedJob,
    tenant: TenantShare,
    starting: int,
    healthy: LiveNodes,
    whole: LiveNodes,
    now: datetime,
) -> list[Pending]:
    """What holds the job back whatever the jobs ahead of it do."""
    reasons = []
    if healthy.nodes == 0:
        reasons.append(Pending(Reason.NO_NODES, Blocking.WAITING, "no node is READY"))
    elif (why := unschedulable_reason(job.demand, healthy)) is not None:
        if unschedulable_reason(job.demand, whole) is None:
            unhealthy = whole.total_gpus - healthy.total_gpus
            detail = f"{why}, and {unhealthy} unhealthy GPU(s) on READY nodes would make room"
            reasons.append(Pending(Reason.GPU_UNHEALTHY, Blocking.NEVER, detail))
        else:
            reasons.append(Pending(Reason.UNSCHEDULABLE, Blocking.NEVER, why))
    gpus = total_gpus(job.demand)
    if tenant.gpu_quota is not None and gpus > tenant.gpu_quota:
        detail = f"needs {gpus} GPU(s); tenant {tenant.name}'s quota is {tenant.gpu_quota}"
        reasons.append(Pending(Reason.QUOTA, Blocking.NEVER, detail))
    elif not within_quota(tenant, tenant.held + starting + gpus):
        more = f" (+{starting} starting)" if starting else ""
        detail = (
            f"tenant {tenant.name} holds {tenant.held}{more} of its {tenant.gpu_quota} GPU(s); "
            f"this job needs {gpus}"
        )
        reasons.append(Pending(Reason.QUOTA, Blocking.WAITING, detail))
    if job.not_before is not None and job.not_before > now:
        detail = f"restart backoff until {job.not_before.isoformat()}"
        reasons.append(Pending(Reason.BACKOFF, Blocking.WAITING, detail))
    return reasons


def _behind(
    job: QueuedJob,
    tenant: TenantShare,
    ahead: int,
    own_ahead: Counter[int],
    all_ahead: Counter[int],
    order: Order,
) -> list[Pending]:
    """The jobs ahead that stand before this one. Under fair share: other tenants' (by fair
    share), and its tenant's own of higher priority; under priority, every job of higher
    priority; under fifo none is named (those submitted before it take the room first)."""
    reasons = []
    if order is Order.PRIORITY:
        higher = sum(count for priority, count in all_ahead.items() if priority > job.priority)
        if higher:
            detail = f"{higher} job(s) with higher priority come first"
            reasons.append(Pending(Reason.PRIORITY, Blocking.WAITING, detail))
        return reasons
    if order is not Order.FAIR_SHARE:
        return reasons
    others = ahead - sum(own_ahead.values())
    if others:
        detail = (
            f"{others} job(s) of other tenants come first: tenant {tenant.name} holds "
            f"{tenant.held} GPU(s) at weight {tenant.weight:g}"
        )
        reasons.append(Pending(Reason.FAIR_SHARE, Blocking.WAITING, detail))
    higher = sum(count for priority, count in own_ahead.items() if priority > job.priority)
    if higher:
        detail = f"{higher} job(s) of tenant {tenant.name} with higher priority come first"
        reasons.append(Pending(Reason.PRIORITY, Blocking.WAITING, detail))
    return reasons


def _starting(detail: str) -> Pending:
    return Pending(Reason.STARTING, Blocking.WAITING, detail)


def _short(demand: Demand, most: tuple[int, float, int]) -> Pending:
    """Which resource no READY node has enough of now (`most`: the most of each kind free on one
    node, `Room.most`), or that none has them all together."""
    whole = demand.learners == 1
    kinds = ("GPU(s)", "CPUs", "MiB of memory")
    need = dict(zip(kinds, (demand.gpus, demand.cpus, demand.memory_mb), strict=True))
    free = dict(zip(kinds, most, strict=True))
    short = [
        f"{need[kind]:g} free {kind} (the most free on one is {free[kind]:g})"
        for kind in kinds
        if need[kind] > free[kind]
    ]
    where = "no READY node has" if whole else "no READY node has, for one learner,"
    if short:
        return Pending(Reason.RESOURCES, Blocking.WAITING, f"{where} {' or '.join(short)}")
    together = ", ".join(f"{need[kind]:g} {kind}" for kind in kinds)
    if not whole:
        detail = (
            f"the READY nodes have no room for its {demand.learners} learners ({together} each)"
        )
        if demand.per_node is not None:
            nodes = demand.learners // demand.per_node
            detail += f", {demand.per_node} on each of {nodes} nodes"
    else:
        detail = f"no READY node has {together} free together"
    return Pending(Reason.RESOURCES, Blocking.WAITING, detail)


def _live(nodes: Sequence[NodeRoom], *, counting_unhealthy: bool) -> LiveNodes:
    gpus = [node.gpus + (node.unhealthy if counting_unhealthy else 0) for node in nodes]
    return LiveNodes(
        nodes=len(nodes),
        gpus=max(gpus, default=0),
        cpus=max((node.cpus for node in nodes), default=0.0),
        memory_mb=max((node.memory_mb for node in nodes), default=0),
        total_gpus=sum(gpus),
    )


class Room:
    """What the READY nodes can still give, as claims take it and jobs give it back."""

    def __init__(self, capacities: Iterable[Capacity]) -> None:
        self._capacities = sorted(capacities, key=lambda c: c.node)
        self._at = {c.node: i for i, c in enumerate(self._capacities)}
        self._most = _Most(self._capacities)

    @property
    def most(self) -> tuple[int, float, int]:
        """The most free GPUs, CPUs and memory on one node (each kind on its own): a job
        whose learner needs more fits nowhere, and is told so without a look at every node."""
        return self._most.value

    def take(self, demand: Demand) -> list[LearnerAllocation] | None:
        """Place the job as a claim would (on the first node it fits, the roomiest others
        taking the rest of its learners) and keep what is left; None where it fits nowhere."""
        gpus, cpus, memory_mb = self.most
        if demand.gpus > gpus or demand.cpus > cpus or demand.memory_mb > memory_mb:
            return None
        for here in self._capacities:
            if not fits(demand, here, self._capacities):
                continue
            # All of it on the first node, as mostly, places the same without the others
            # sorted: a sort of every node for each job was most of a round at a thousand.
            learners = place(demand, [here]) or place(demand, [here, *self._roomiest(here)])
            if learners is None:
                continue
            for node in {learner.node for learner in learners}:
                self._replace(self._capacities[self._at[node]].less(learners, demand))
            return learners
        return None

    def copy(self) -> Room:
        """The same room, to be taken from apart (the nodes' names and order are shared)."""
        copied = Room.__new__(Room)
        copied._capacities = list(self._capacities)
        copied._at = self._at
        copied._most = self._most.copy()
        return copied

    def give(self, node: str, gpus: Sequence[str], cpus: float, memory_mb: int) -> None:
        """A learner's room back on `node` (nothing where the node is not READY)."""
        if (at := self._at.get(node)) is not None:
            c = self._capacities[at]
            self._replace(
                Capacity(node, sorted([*c.gpus, *gpus]), c.cpus + cpus, c.memory_mb + memory_mb)
            )

    def _roomiest(self, here: Capacity) -> list[Capacity]:
        return sorted(
            (c for c in self._capacities if c is not here),
            key=lambda c: (-len(c.gpus), -c.cpus, -c.memory_mb, c.node),
        )

    def _replace(self, new: Capacity) -> None:
        at = self._at[new.node]
        self._most.replace(self._capacities[at], new)
        self._capacities[at] = new


class _Most:
    """The most of each kind free on one node, kept as nodes change: the nodes are counted by
    each value, so that a change costs a look at the values rather than at every node."""

    def __init__(self, capacities: Iterable[Capacity]) -> None:
        self._counts: tuple[Counter[float], ...] = (Counter(), Counter(), Counter())
        for capacity in capacities:
            self._count(capacity, 1)
        self.value = self._read()

    def copy(self) -> _Most:
        copied = _Most(())
        copied._counts = tuple(Counter(counts) for counts in self._counts)
        copied.value = self.value
        return copied

    def replace(self, old: Capacity, new: Capacity) -> None:
        self._count(old, -1)
        self._count(new, 1)
        self.value = self._read()

    def _count(self, capacity: Capacity, by: int) -> None:
        kinds = (len(capacity.gpus), capacity.cpus, capacity.memory_mb)
        for counts, value in zip(self._counts, kinds, strict=True):
            counts[value] += by
            if not counts[value]:
                del counts[value]

    def _read(self) -> tuple[int, float, int]:
        gpus, cpus, memory_mb = (max(counts, default=0) for counts in self._counts)
        return int(gpus), cpus, int(memory_mb)
