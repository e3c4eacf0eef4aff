"""The pending reasons judge the queue under the claim policy in force: its order (fair share,
priority or fifo) is the claims' (`claim_order`, the same ranking), and only the reasons that
order gives are named; with quotas off no quota holds a job back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.pending.estimates import estimated_in_order
from controlplane.pending.reasons import NodeRoom, Reason, assess, queue_order
from controlplane.scheduling.claim_order import QueuedJob, TenantShare, claim_order, shares
from controlplane.scheduling.placement import Capacity, Demand
from controlplane.scheduling.policy import ClaimPolicy, Order

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def job(n: int, tenant: str, *, priority: int = 0, gpus: int = 1) -> QueuedJob:
    return QueuedJob(
        UUID(int=n),
        tenant,
        Demand(1, gpus, 1.0, 1024),
        priority,
        NOW - timedelta(minutes=100 - n),
        None,
    )


def node(free_gpus: int, gpus: int = 8) -> NodeRoom:
    room = Capacity("n0", [f"g{k}" for k in range(free_gpus)], 64.0, 1 << 20)
    return NodeRoom(room, gpus=gpus, unhealthy=0, cpus=64.0, memory_mb=1 << 20)


TENANTS = [TenantShare("acme", 1.0, None, 4), TenantShare("globex", 1.0, 1, 0)]
QUEUE = [job(1, "acme", priority=0), job(2, "globex", priority=0), job(3, "acme", priority=5)]


def test_each_order_ranks_the_queue_its_way() -> None:
    ranked = {order: [j.job_id.int for j in queue_order(TENANTS, QUEUE, order)] for order in Order}
    # Fair share: globex holds nothing; then acme's own by priority.
    assert ranked[Order.FAIR_SHARE] == [2, 3, 1]
    assert ranked[Order.PRIORITY] == [3, 1, 2]
    assert ranked[Order.FIFO] == [1, 2, 3]


def test_the_reasons_name_what_the_order_puts_ahead() -> None:
    def reasons(order: Order) -> dict[int, set[Reason]]:
        assessed = assess([node(1)], TENANTS, QUEUE, now=NOW, order=order)
        return {a.job_id.int: {p.reason for p in a.reasons} for a in assessed}

    assert reasons(Order.FAIR_SHARE) == {
        2: {Reason.STARTING},
        3: {Reason.RESOURCES, Reason.FAIR_SHARE},
        1: {Reason.RESOURCES, Reason.FAIR_SHARE, Reason.PRIORITY},
    }
    assert reasons(Order.PRIORITY) == {
        3: {Reason.STARTING},
        1: {Reason.RESOURCES, Reason.PRIORITY},
        2: {Reason.RESOURCES, Reason.PRIORITY},
    }
    assert reasons(Order.FIFO) == {
        1: {Reason.STARTING},
        2: {Reason.RESOURCES},
        3: {Reason.RESOURCES},
    }


def test_with_quotas_off_no_quota_holds_a_job_back() -> None:
    queue = [job(1, "globex", gpus=2)]
    held = assess([node(8)], TENANTS, queue, now=NOW)
    assert {p.reason for p in held[0].reasons} == {Reason.QUOTA}
    free = assess([node(8)], shares(TENANTS, ClaimPolicy(quotas=False)), queue, now=NOW)
    assert {p.reason for p in free[0].reasons} == {Reason.STARTING}


def test_the_estimates_follow_the_order() -> None:
    for order, first in ((Order.FIFO, 1), (Order.PRIORITY, 3)):
        ordered = queue_order(TENANTS, QUEUE, order)
        starts = estimated_in_order([node(1)], TENANTS, ordered, [], {}, now=NOW)
        assert list(starts) == [UUID(int=first)]


@settings(max_examples=300)
@given(
    order=st.sampled_from(Order),
    held=st.lists(st.integers(0, 4), min_size=3, max_size=3),
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=3, max_size=3),
    jobs=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(-1, 2), st.integers(1, 2)),
        max_size=12,
    ),
)
def test_on_a_node_with_room_for_all_the_claim_takes_the_queue_in_its_order(
    order: Order,
    held: list[int],
    weights: list[float],
    jobs: list[tuple[str, int, int]],
) -> None:
    # The pending reasons' cluster-wide order and one claim's are the same ranking.
    tenants = [TenantShare(t, w, None, h) for t, w, h in zip("abc", weights, held, strict=True)]
    queue = [job(n, t, priority=p, gpus=g) for n, (t, p, g) in enumerate(jobs, start=1)]
    room = Capacity("n0", [f"g{k}" for k in range(64)], 64.0, 1 << 20)
    taken = claim_order("n0", [room], tenants, queue, limit=64, now=NOW, policy=ClaimPolicy(order))
    assert taken == queue_order(tenants, queue, order)
