"""The recorder's walk resumed from the last round's (`pending.resume`): over any sequence of
arrivals, claims, cancellations, restarts, node changes, policy changes and time passing, each
round judges exactly as the whole walk does, and walks again only from where the queue changed."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.pending.reasons import NodeRoom, assess, queue_order
from controlplane.pending.recorder import Snapshot, _judged
from controlplane.pending.resume import ResumedWalk
from controlplane.scheduling.claim_order import QueuedJob, TenantShare
from controlplane.scheduling.placement import Capacity, Demand
from controlplane.scheduling.policy import DEFAULT, ClaimPolicy, Order

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TENANTS = ("acme", "globex", "initech")
DURATIONS = {(tenant, "train"): timedelta(seconds=30) for tenant in TENANTS[:2]}


@dataclass
class Cluster:
    """What a round reads, as the recorder's snapshot has it (rows as mappings)."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    tenants: list[dict[str, Any]] = field(default_factory=list)
    running: list[dict[str, Any]] = field(default_factory=list)
    policy: ClaimPolicy = DEFAULT
    at: datetime = NOW
    made: int = 0

    def snapshot(self) -> Snapshot:
        return Snapshot(
            [dict(r) for r in self.jobs],
            self.policy,
            [dict(r) for r in self.tenants],
            [dict(r) for r in self.nodes],
            [dict(r) for r in self.running],
        )

    def arrive(self, tenant: str, priority: int, gpus: int, learners: int, back: int) -> None:
        """A job submitted now (or a while ago: `back` seconds, as a restart keeps its
        submission time), which may land anywhere in the order."""
        self.made += 1
        self.jobs.append(
            {
                "job_id": UUID(int=self.made),
                "attempt": 1,
                "tenant": tenant,
                "name": "train",
                "learners": learners,
                "gpus_per_learner": gpus,
                "cpus_per_learner": 1.0,
                "memory_mb_per_learner": 1024,
                "learners_per_node": None,
                "priority": priority,
                "submitted_at": self.at - timedelta(seconds=back),
                "not_before": None,
                "inference": tenant == "initech" and priority == 2,
                "allocated": False,
            }
        )

    def claim(self, pick: int) -> None:
        """The first queued training job that fits a node is claimed: its room is taken, its
        tenant holds its GPUs, and it leaves the queue."""
        for job in self.jobs:
            if job["inference"] or job["allocated"] or job["learners"] > 1:
                continue
            for node in self.nodes:
                if len(node["free_gpus"]) >= job["gpus_per_learner"]:
                    gpus = node["free_gpus"][: job["gpus_per_learner"]]
                    node["free_gpus"] = node["free_gpus"][job["gpus_per_learner"] :]
                    node["free_cpus"] -= 1.0
                    node["free_memory_mb"] -= 1024
                    self._hold(job["tenant"], len(gpus))
                    self.running.append(
                        {
                            "tenant": job["tenant"],
                            "name": job["name"],
                            "node": node["name"],
                            "gpus": gpus,
                            "cpus": 1.0,
                            "memory_mb": 1024,
                            "allocated_at": self.at,
                        }
                    )
                    # Claimed, its deployment not projected yet (`allocated`), or gone.
                    if pick % 2:
                        job["allocated"] = True
                    else:
                        self.jobs.remove(job)
                    return

    def release(self) -> None:
        """The oldest running job ends: its room comes back."""
        if not self.running:
            return
        ended = self.running.pop(0)
        for node in self.nodes:
            if node["name"] == ended["node"]:
                node["free_gpus"] = sorted([*node["free_gpus"], *ended["gpus"]])
                node["free_cpus"] += 1.0
                node["free_memory_mb"] += 1024
        self._hold(ended["tenant"], -len(ended["gpus"]))

    def cancel(self, pick: int) -> None:
        if self.jobs:
            del self.jobs[pick % len(self.jobs)]

    def back_off(self, pick: int, seconds: int) -> None:
        """A job restarted: queued again, behind a backoff."""
        if self.jobs:
            job = self.jobs[pick % len(self.jobs)]
            job["attempt"] += 1
            job["not_before"] = self.at + timedelta(seconds=seconds)

    def _hold(self, tenant: str, gpus: int) -> None:
        for row in self.tenants:
            if row["name"] == tenant:
                row["held"] += gpus


def cluster(nodes: int) -> Cluster:
    made = Cluster()
    made.nodes = [
        {
            "name": f"n{k}",
            "free_gpus": [f"n{k}-g{g}" for g in range(4)],
            "free_cpus": 8.0,
            "free_memory_mb": 16384,
            "healthy": 4,
            "unhealthy": 0,
            "cpus": 8.0,
            "memory_mb": 16384,
        }
        for k in range(nodes)
    ]
    # initech has no row: a tenant the policy does not know is ordered last.
    made.tenants = [
        {"name": "acme", "weight": 1.0, "gpu_quota": 6, "held": 0},
        {"name": "globex", "weight": 2.0, "gpu_quota": None, "held": 0},
    ]
    return made


def step(made: Cluster, op: tuple[Any, ...]) -> None:
    kind, *args = op
    if kind == "arrive":
        made.arrive(*args)
    elif kind == "burst":
        for k in range(args[0]):
            made.arrive(TENANTS[k % 3], 0, 1, 1, 0)
    elif kind == "claim":
        made.claim(*args)
    elif kind == "release":
        made.release()
    elif kind == "cancel":
        made.cancel(*args)
    elif kind == "back_off":
        made.back_off(*args)
    elif kind == "time":
        made.at += timedelta(seconds=args[0])
    elif kind == "policy":
        made.policy = ClaimPolicy(args[0], args[1])
    elif kind == "weight":
        made.tenants[1]["weight"] = args[0]
    elif kind == "node":
        node = made.nodes[args[0] % len(made.nodes)]
        node["free_gpus"], node["healthy"], node["unhealthy"] = node["free_gpus"][:-1], 3, 1


OPS = st.one_of(
    st.tuples(
        st.just("arrive"),
        st.sampled_from(TENANTS),
        st.integers(0, 2),
        st.integers(1, 5),
        st.integers(1, 3),
        st.integers(0, 600),
    ),
    st.tuples(st.just("burst"), st.integers(1, 40)),
    st.tuples(st.just("claim"), st.integers(0, 1)),
    st.tuples(st.just("release")),
    st.tuples(st.just("cancel"), st.integers(0, 1000)),
    st.tuples(st.just("back_off"), st.integers(0, 1000), st.integers(1, 20)),
    st.tuples(st.just("time"), st.integers(0, 15)),
    st.tuples(st.just("policy"), st.sampled_from(list(Order)), st.booleans()),
    st.tuples(st.just("weight"), st.sampled_from([0.5, 2.0, 4.0])),
    st.tuples(st.just("node"), st.integers(0, 10)),
)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 3),
    st.lists(st.lists(OPS, min_size=1, max_size=4), min_size=1, max_size=25),
    st.sampled_from([1, 3, 8]),
)
def test_each_round_judges_as_the_whole_walk_does(
    nodes: int, rounds: list[list[tuple[Any, ...]]], checkpoint: int
) -> None:
    made = cluster(nodes)
    walk = ResumedWalk(checkpoint)
    for ops in rounds:
        for op in ops:
            step(made, op)
        snapshot = made.snapshot()
        assert _judged(snapshot, made.at, DURATIONS, walk) == _judged(snapshot, made.at, DURATIONS)


def job(n: int, tenant: str, *, priority: int = 0, not_before: datetime | None = None) -> QueuedJob:
    return QueuedJob(
        UUID(int=n),
        tenant,
        Demand(1, 1, 1.0, 1024),
        priority,
        NOW + timedelta(seconds=n),
        not_before,
    )


def node(name: str, free: int) -> NodeRoom:
    return NodeRoom(
        Capacity(name, [f"{name}-g{k}" for k in range(free)], 64.0, 1 << 20), 8, 0, 64.0, 1 << 20
    )


SHARES = [TenantShare("acme", 1.0, None, 0), TenantShare("globex", 3.0, None, 0)]
NODES = [node("n0", 4), node("n1", 4)]


def walked(
    walk: ResumedWalk, queue: list[QueuedJob], now: datetime = NOW, nodes: list[NodeRoom] = NODES
) -> int:
    """How many jobs the resumed walk walked, once its judgement is found the whole walk's."""
    ordered = queue_order(SHARES, queue, Order.FAIR_SHARE)
    got = walk.assess(nodes, SHARES, ordered, now=now, order=Order.FAIR_SHARE)
    assert got == assess(nodes, SHARES, queue, now=now, order=Order.FAIR_SHARE)
    return walk.walked


def test_new_jobs_at_the_end_are_walked_alone() -> None:
    walk = ResumedWalk(checkpoint=64)
    queue = [job(n, "acme") for n in range(1, 1001)]
    assert walked(walk, queue) == 1000
    queue += [job(n, "acme") for n in range(1001, 1006)]
    assert walked(walk, queue) == 5
    assert walked(walk, queue) == 0


def test_a_new_job_the_order_puts_in_the_middle_resumes_there() -> None:
    """Under fair share, globex (weight 3, holding nothing) goes ahead of most of acme's jobs:
    its new job lands in the middle of the order, and every job after it is walked again (a
    walk that judged only the new jobs would leave them as they were, wrongly)."""
    walk = ResumedWalk(checkpoint=64)
    queue = [job(n, "acme") for n in range(1, 1001)]
    walked(walk, queue)
    queue.append(job(1001, "globex"))
    at = [a.job_id for a in assess(NODES, SHARES, queue, now=NOW)].index(UUID(int=1001))
    assert 0 < at < 1000
    assert 1000 - at < walked(walk, queue) <= 1001 - at + 64


def test_a_cancellation_a_backoff_s_end_and_a_claim() -> None:
    walk = ResumedWalk(checkpoint=64)
    queue = [job(n, "acme") for n in range(1, 1001)]
    queue[700] = job(701, "acme", not_before=NOW + timedelta(seconds=5))
    walked(walk, queue)
    del queue[900]
    assert walked(walk, queue) <= 99 + 64
    # Time passes the backoff's end: the job behind it, and those after it, change.
    assert walked(walk, queue, NOW + timedelta(seconds=6)) <= 300 + 64
    # A claim takes a node's room: every job's judgement may change, so all are walked again.
    claimed = [node("n0", 3), node("n1", 4)]
    assert walked(walk, queue[1:], NOW + timedelta(seconds=6), claimed) == 998
