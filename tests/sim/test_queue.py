"""The replay's queue offers `claim_order` only the first jobs of each tenant and demand: for
generated tenants, nodes and queues, under every order, with and without quotas, it chooses
the same jobs in the same order as over the whole queue; also after jobs leave the queue."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.scheduling.claim_order import CLAIM_BATCH, QueuedJob, TenantShare, claim_order
from controlplane.scheduling.placement import Capacity, Demand
from controlplane.scheduling.policy import ClaimPolicy, Order
from sim.queue import Queue

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DEMANDS = [Demand(1, 1, 1.0, 1024), Demand(1, 2, 1.0, 1024), Demand(2, 1, 0.5, 512)]

tenants = st.lists(
    st.builds(
        TenantShare,
        st.sampled_from(["t0", "t1", "t2"]),
        st.sampled_from([0.5, 1.0, 3.0]),
        st.one_of(st.none(), st.integers(0, 6)),
        st.integers(0, 4),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda t: t.name,
)
rooms = st.lists(
    st.builds(
        Capacity,
        st.just(""),
        st.integers(0, 5).map(lambda n: [f"g{i}" for i in range(n)]),
        st.sampled_from([0.5, 1.0, 4.0]),
        st.sampled_from([512, 1024, 4096]),
    ),
    min_size=1,
    max_size=3,
).map(lambda found: [Capacity(f"n{k}", r.gpus, r.cpus, r.memory_mb) for k, r in enumerate(found)])


@st.composite
def queues(draw: st.DrawFn) -> list[QueuedJob]:
    count = draw(st.integers(0, 30))
    ids = draw(st.lists(st.uuids(), min_size=count, max_size=count, unique=True))
    return [
        QueuedJob(
            job_id,
            draw(st.sampled_from(["t0", "t1", "t2"])),
            draw(st.sampled_from(DEMANDS)),
            draw(st.integers(0, 2)),
            T0 + timedelta(seconds=draw(st.integers(0, 5))),
            None,
        )
        for job_id in ids
    ]


@settings(max_examples=500, deadline=None)
@given(
    shares=tenants,
    ready=rooms,
    queue=queues(),
    order=st.sampled_from(list(Order)),
    quotas=st.booleans(),
    leaving=st.sets(st.integers(0, 29)),
)
def test_the_heads_of_the_queue_choose_as_the_whole_queue_does(
    shares: list[TenantShare],
    ready: list[Capacity],
    queue: list[QueuedJob],
    order: Order,
    quotas: bool,
    leaving: set[int],
) -> None:
    policy = ClaimPolicy(order, quotas)
    indexed = Queue(order, queue)
    for k in range(len(queue)):
        indexed.add(k)
    for k in sorted(leaving):
        if k < len(queue):
            indexed.remove(k)
    left = [job for k, job in enumerate(queue) if k not in leaving]
    here = ready[0]
    per_tenant = min(CLAIM_BATCH, max(len(here.gpus), 1))

    def chosen(offered: list[QueuedJob]) -> list[UUID]:
        taken = claim_order(
            here.node, ready, shares, offered, limit=CLAIM_BATCH, now=T0, policy=policy
        )
        return [job.job_id for job in taken]

    assert chosen(indexed.heads(per_tenant)) == chosen(left)
    assert indexed.waiting == len(left)
    assert set(indexed.demands()) == {job.demand for job in left}
