"""Pending reasons, pure: every queued job gets all the reasons that apply, with details that
name what is short, and the jobs let start fit the cluster together."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.pending.reasons import (
    Assessment,
    Blocking,
    NodeRoom,
    Reason,
    Room,
    assess,
    queue_order,
)
from controlplane.scheduling.claim_order import QueuedJob, TenantShare, fits
from controlplane.scheduling.placement import Capacity, Demand, LearnerAllocation, place

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def node(name: str, free_gpus: int, *, gpus: int | None = None, unhealthy: int = 0) -> NodeRoom:
    return NodeRoom(
        Capacity(name, [f"{name}-g{k}" for k in range(free_gpus)], 8.0, 16384),
        gpus=free_gpus if gpus is None else gpus,
        unhealthy=unhealthy,
        cpus=8.0,
        memory_mb=16384,
    )


def job(
    n: int,
    tenant: str,
    gpus: int = 1,
    *,
    learners: int = 1,
    priority: int = 0,
    not_before: datetime | None = None,
) -> QueuedJob:
    return QueuedJob(
        UUID(int=n),
        tenant,
        Demand(learners, gpus, 1.0, 1024),
        priority,
        NOW - timedelta(minutes=100 - n),
        not_before,
    )


def reasons(assessed: list[Assessment], n: int) -> dict[Reason, tuple[Blocking, str]]:
    [one] = [a for a in assessed if a.job_id == UUID(int=n)]
    return {p.reason: (p.blocking, p.detail) for p in one.reasons}


def test_with_no_node_every_job_waits_for_one() -> None:
    tenants = [TenantShare("acme", 1.0, None, 0)]
    assessed = assess([], tenants, [job(1, "acme"), job(2, "acme", 0)], now=NOW)
    assert [set(reasons(assessed, n)) for n in (1, 2)] == [{Reason.NO_NODES}] * 2
    assert [a.position for a in assessed] == [1, 2]


def test_the_jobs_ahead_take_the_room_and_the_rest_say_who_and_what() -> None:
    # acme holds 2 GPUs already: globex's jobs come first, and the one free GPU goes to the
    # first of them.
    tenants = [TenantShare("acme", 1.0, None, 2), TenantShare("globex", 1.0, None, 0)]
    queue = [job(1, "acme"), job(2, "globex"), job(3, "globex")]
    assessed = assess([node("n0", 1, gpus=3)], tenants, queue, now=NOW)
    assert [a.job_id.int for a in assessed] == [2, 3, 1]
    assert set(reasons(assessed, 2)) == {Reason.STARTING}
    assert set(reasons(assessed, 3)) == {Reason.RESOURCES}  # only its own tenant's job ahead
    acme = reasons(assessed, 1)
    assert set(acme) == {Reason.RESOURCES, Reason.FAIR_SHARE}
    assert acme[Reason.FAIR_SHARE][1] == (
        "2 job(s) of other tenants come first: tenant acme holds 2 GPU(s) at weight 1"
    )
    assert acme[Reason.RESOURCES][1] == (
        "no READY node has 1 free GPU(s) (the most free on one is 0)"
    )


def test_higher_priority_jobs_of_the_tenant_come_first() -> None:
    tenants = [TenantShare("acme", 1.0, None, 0)]
    queue = [job(1, "acme"), job(2, "acme", priority=5), job(3, "acme", priority=5)]
    assessed = assess([node("n0", 1)], tenants, queue, now=NOW)
    assert [a.job_id.int for a in assessed] == [2, 3, 1]
    assert reasons(assessed, 1)[Reason.PRIORITY][1] == (
        "2 job(s) of tenant acme with higher priority come first"
    )
    assert set(reasons(assessed, 3)) == {Reason.RESOURCES}  # the same priority: its turn


def test_never_as_is_and_waiting_are_told_apart() -> None:
    tenants = [TenantShare("acme", 1.0, 2, 1)]
    nodes = [node("n0", 2, gpus=2, unhealthy=2)]
    later = NOW + timedelta(seconds=30)
    queue = [
        job(1, "acme", 8),  # no node could ever hold it
        job(2, "acme", 4),  # a node would, were its GPUs healthy; and over the quota alone
        job(3, "acme", 2),  # the quota: acme holds 1 of 2
        job(4, "acme", 1, not_before=later),
        job(5, "acme", 1),
    ]
    assessed = assess(nodes, tenants, queue, now=NOW)
    assert reasons(assessed, 1)[Reason.UNSCHEDULABLE] == (
        Blocking.NEVER,
        "needs 8 healthy GPU(s) on one node; the largest node has 2",
    )
    two = reasons(assessed, 2)
    assert two[Reason.GPU_UNHEALTHY][0] is Blocking.NEVER
    assert "2 unhealthy GPU(s) on READY nodes would make room" in two[Reason.GPU_UNHEALTHY][1]
    assert two[Reason.QUOTA] == (Blocking.NEVER, "needs 4 GPU(s); tenant acme's quota is 2")
    assert reasons(assessed, 3)[Reason.QUOTA] == (
        Blocking.WAITING,
        "tenant acme holds 1 of its 2 GPU(s); this job needs 2",
    )
    assert reasons(assessed, 4) == {
        Reason.BACKOFF: (Blocking.WAITING, f"restart backoff until {later.isoformat()}")
    }
    assert set(reasons(assessed, 5)) == {Reason.STARTING}
    # A job let start counts against the quota of those after it.
    queue.append(job(6, "acme", 1))
    assert reasons(assess(nodes, tenants, queue, now=NOW), 6)[Reason.QUOTA][1] == (
        "tenant acme holds 1 (+1 starting) of its 2 GPU(s); this job needs 1"
    )


def test_a_job_of_several_learners_is_short_of_room_across_nodes() -> None:
    tenants = [TenantShare("acme", 1.0, None, 0)]
    queue = [job(1, "acme", 1, learners=3)]
    assessed = assess([node("n0", 1, gpus=2), node("n1", 1, gpus=2)], tenants, queue, now=NOW)
    assert reasons(assessed, 1) == {
        Reason.RESOURCES: (
            Blocking.WAITING,
            "the READY nodes have no room for its 3 learners (1 GPU(s), 1 CPUs, 1024 MiB of "
            "memory each)",
        )
    }
    spread = assess([node("n0", 2), node("n1", 1)], tenants, queue, now=NOW)
    assert set(reasons(spread, 1)) == {Reason.STARTING}


def test_a_job_with_learners_per_node_waits_for_nodes_that_each_hold_that_many() -> None:
    tenants = [TenantShare("acme", 1.0, None, 0)]
    pairs = QueuedJob(UUID(int=1), "acme", Demand(4, 1, 1.0, 1024, 2), 0, NOW, None)
    # Three free GPUs and one: four learners fit, two on each of two nodes do not.
    assessed = assess([node("n0", 3), node("n1", 1, gpus=2)], tenants, [pairs], now=NOW)
    assert reasons(assessed, 1) == {
        Reason.RESOURCES: (
            Blocking.WAITING,
            "the READY nodes have no room for its 4 learners (1 GPU(s), 1 CPUs, 1024 MiB of "
            "memory each), 2 on each of 2 nodes",
        )
    }
    assert set(reasons(assess([node("n0", 3), node("n1", 2)], tenants, [pairs], now=NOW), 1)) == {
        Reason.STARTING
    }
    # Four on a node where the largest has three GPUs: never, as the cluster stands.
    whole = QueuedJob(UUID(int=1), "acme", Demand(4, 1, 1.0, 1024, 4), 0, NOW, None)
    never = reasons(assess([node("n0", 3), node("n1", 3)], tenants, [whole], now=NOW), 1)
    assert never[Reason.UNSCHEDULABLE] == (
        Blocking.NEVER,
        "needs 4 healthy GPU(s) for its 4 learners on each node; the largest node has 3",
    )


tenant_names = st.sampled_from(["a", "b", "c"])


@given(
    free=st.lists(st.integers(0, 4), max_size=4),
    shares=st.lists(
        st.tuples(st.sampled_from([0.5, 1.0, 3.0]), st.one_of(st.none(), st.integers(0, 6))),
        min_size=3,
        max_size=3,
    ),
    jobs=st.lists(
        st.tuples(tenant_names, st.integers(0, 3), st.integers(1, 2), st.integers(-1, 1)),
        max_size=25,
    ),
)
def test_every_queued_job_has_a_reason_and_those_let_start_fit_together(
    free: list[int],
    shares: list[tuple[float, int | None]],
    jobs: list[tuple[str, int, int, int]],
) -> None:
    tenants = [
        TenantShare(name, weight, quota, 0)
        for name, (weight, quota) in zip("abc", shares, strict=True)
    ]
    nodes = [node(f"n{k}", gpus) for k, gpus in enumerate(free)]
    queue = [
        job(n, tenant, gpus, learners=learners, priority=priority)
        for n, (tenant, gpus, learners, priority) in enumerate(jobs, start=1)
    ]
    assessed = assess(nodes, tenants, queue, now=NOW)
    assert [a.job_id for a in assessed] == [j.job_id for j in queue_order(tenants, queue)]
    assert [a.position for a in assessed] == list(range(1, len(queue) + 1))
    assert all(a.reasons for a in assessed)
    demand = {j.job_id: j.demand for j in queue}
    starting = [a.job_id for a in assessed if a.reasons[0].reason is Reason.STARTING]
    assert sum(demand[j].learners * demand[j].gpus for j in starting) <= sum(free)
    # A job let start waits for nothing else; one held back is never also said to start.
    for a in assessed:
        kinds = [p.reason for p in a.reasons]
        assert kinds == [Reason.STARTING] or Reason.STARTING not in kinds


def spec_take(
    capacities: list[Capacity], demand: Demand
) -> tuple[list[LearnerAllocation] | None, list[Capacity]]:
    """A claim's placement as the claim states it, over every node each time: the first node
    (by name) where the job fits, then the roomiest others; the nodes as they are left."""
    for here in capacities:
        if not fits(demand, here, capacities):
            continue
        others = sorted(
            (c for c in capacities if c is not here),
            key=lambda c: (-len(c.gpus), -c.cpus, -c.memory_mb, c.node),
        )
        learners = place(demand, [here, *others])
        if learners is not None:
            used = {learner.node for learner in learners}
            return learners, [c.less(learners, demand) if c.node in used else c for c in capacities]
    return None, capacities


@settings(max_examples=400)
@given(
    nodes=st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from([0.5, 2.0, 4.0]), st.integers(0, 4)),
        max_size=6,
    ),
    steps=st.lists(
        st.one_of(
            st.tuples(
                st.just("take"),
                st.integers(1, 4),
                st.integers(0, 2),
                st.sampled_from([0.5, 1.0]),
                st.integers(1, 2),
            ),
            st.tuples(
                st.just("give"), st.integers(0, 6), st.integers(0, 2), st.just(1.0), st.just(1)
            ),
        ),
        max_size=30,
    ),
)
def test_the_room_places_each_job_as_the_claim_would_and_knows_the_most_left(
    nodes: list[tuple[int, float, int]], steps: list[tuple[str, int, int, float, int]]
) -> None:
    """The room keeps its nodes and their maxima as it goes, rather than looking at every node
    again for each job: it must place and refuse exactly as the claim's rule over every node."""
    model = [
        Capacity(f"n{k}", [f"n{k}-g{g}" for g in range(gpus)], cpus, memory * 1024)
        for k, (gpus, cpus, memory) in enumerate(nodes)
    ]
    room = Room(reversed(model))  # in any order: it goes by name, as the claim's SQL
    given_back = 0
    for kind, a, gpus, cpus, memory in steps:
        if kind == "take":
            demand = Demand(a, gpus, cpus, memory * 1024)
            expected, model = spec_take(model, demand)
            assert room.take(demand) == expected
        else:
            name = f"n{a}"
            back = [f"{name}-back{given_back + g}" for g in range(gpus)]
            given_back += gpus
            room.give(name, back, cpus, memory * 1024)
            model = [
                Capacity(
                    c.node, sorted([*c.gpus, *back]), c.cpus + cpus, c.memory_mb + memory * 1024
                )
                if c.node == name
                else c
                for c in model
            ]
        assert room.most == (
            max((len(c.gpus) for c in model), default=0),
            max((c.cpus for c in model), default=0.0),
            max((c.memory_mb for c in model), default=0),
        )
