"""The claim order stated in Python (`controlplane.scheduling.claim_order`) is the order the
`claim_candidates` SQL takes under the same claim policy: for generated policies (every order,
quotas on and off, or none set), tenants, nodes, allocations and queues, inserted in a real
Postgres, both choose the same jobs in the same order. And every job it offers, the claim can
place."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import asyncpg
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from controlplane.agents.events import GpuInfo
from controlplane.queries import Q
from controlplane.scheduling.claim_order import QueuedJob, TenantShare, claim_order, fits
from controlplane.scheduling.placement import Capacity, Demand, allocatable, place
from controlplane.scheduling.policy import DEFAULT, ClaimPolicy, Order

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NODE = "n0"
"""The claiming node."""


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    ready: bool
    cpus: float
    memory_mb: int
    healthy: list[bool]
    """One GPU each, by index."""


@dataclass(frozen=True, slots=True)
class AllocationRow:
    tenant: str
    node: int
    gpus: int
    cpus: float
    memory_mb: int
    released: bool
    job: int | None
    """Which queued job's attempt it belongs to (claimed, the queue row lagging); None: another."""


@dataclass(frozen=True, slots=True)
class JobRow:
    job_id: UUID
    tenant: str
    queued: bool
    demand: Demand
    priority: int
    submitted_s: int
    backoff: int | None
    """Its restart backoff ends this many hours from now (negative: ended); None: none."""


@dataclass(frozen=True, slots=True)
class World:
    tenants: list[tuple[str, float, int | None]]
    nodes: list[NodeRow]
    allocations: list[AllocationRow]
    jobs: list[JobRow]
    limit: int
    policy: ClaimPolicy | None = None
    """The policy an operator set (its row); None: none was, and the default holds."""


def per_node(learners: int) -> st.SearchStrategy[int | None]:
    """None (as many on a node as fit) or a `learners_per_node` the manifest admits: a divisor
    of `learners`."""
    divisors = [k for k in range(1, learners + 1) if learners % k == 0]
    return st.one_of(st.none(), st.none(), st.sampled_from(divisors))


@st.composite
def demands(draw: st.DrawFn) -> Demand:
    learners = draw(st.sampled_from([1, 1, 2, 3, 4]))
    return Demand(
        learners,
        draw(st.sampled_from([0, 1, 1, 2])),
        draw(st.sampled_from([0.1, 0.5, 1.0, 1.0, 2.0])),
        draw(st.sampled_from([512, 1000, 1024, 1500])),
        draw(per_node(learners)),
    )


@st.composite
def worlds(draw: st.DrawFn) -> World:
    tenant_names = [f"t{i}" for i in range(draw(st.integers(1, 3)))]
    tenants = [
        (
            name,
            draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])),
            draw(st.one_of(st.none(), st.integers(0, 8))),
        )
        for name in tenant_names
    ]
    nodes = [
        NodeRow(
            f"n{i}",
            draw(st.booleans()) if i else draw(st.sampled_from([True, True, True, False])),
            draw(st.sampled_from([1.0, 1.5, 2.0, 4.0, 8.0, 16.0])),
            draw(st.sampled_from([1000, 1500, 2500, 3000, 8192, 16384])),
            draw(
                st.lists(
                    st.sampled_from([True, True, True, False]), min_size=0 if i else 2, max_size=8
                )
            ),
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    job_ids = draw(st.lists(st.uuids(), min_size=2, max_size=16, unique=True))
    jobs = [
        JobRow(
            job_id,
            draw(st.sampled_from([*tenant_names, *tenant_names, "gone"])),
            draw(st.sampled_from([True, True, True, True, False])),
            draw(demands()),
            draw(st.integers(-1, 2)),
            draw(st.integers(0, 3)),
            draw(st.sampled_from([None, None, None, None, -1, 1])),
        )
        for job_id in job_ids
    ]
    allocations = draw(
        st.lists(
            st.builds(
                AllocationRow,
                tenant=st.sampled_from(tenant_names),
                node=st.integers(0, len(nodes) - 1),
                gpus=st.integers(0, 3),
                cpus=st.sampled_from([0.0, 0.5, 1.0]),
                memory_mb=st.sampled_from([0, 500, 1024]),
                released=st.booleans(),
                job=st.one_of(st.none(), st.integers(0, len(jobs) - 1)) if jobs else st.none(),
            ),
            max_size=5,
        )
    )
    policy = draw(
        st.one_of(st.none(), st.builds(ClaimPolicy, st.sampled_from(Order), st.booleans()))
    )
    return World(tenants, nodes, allocations, jobs, draw(st.sampled_from([1, 2, 4, 8, 8])), policy)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(world=worlds())
@example(
    # Three tenants, one with a quota of one GPU, ten one-GPU jobs, five free GPUs: fair share
    # interleaves the tenants and the quota stops one.
    world=World(
        tenants=[("acme", 1.0, None), ("globex", 1.0, None), ("initech", 1.0, 1)],
        nodes=[NodeRow("n0", True, 16.0, 16384, [True] * 5)],
        allocations=[],
        jobs=[
            JobRow(UUID(int=k + 1), tenant, True, Demand(1, 1, 1.0, 1024), 0, k, None)
            for k, tenant in enumerate(["acme"] * 4 + ["globex"] * 4 + ["initech"] * 2)
        ],
        limit=8,
    )
)
@example(
    # The same under fifo without quotas: submission order alone, the quota ignored.
    world=World(
        tenants=[("acme", 1.0, None), ("globex", 1.0, None), ("initech", 1.0, 1)],
        nodes=[NodeRow("n0", True, 16.0, 16384, [True] * 5)],
        allocations=[],
        jobs=[
            JobRow(UUID(int=k + 1), tenant, True, Demand(1, 1, 1.0, 1024), k % 3, 9 - k, None)
            for k, tenant in enumerate(["acme"] * 4 + ["globex"] * 4 + ["initech"] * 2)
        ],
        limit=8,
        policy=ClaimPolicy(Order.FIFO, quotas=False),
    )
)
@example(
    # And under priority: the highest first across tenants, the quota holding.
    world=World(
        tenants=[("acme", 1.0, None), ("globex", 1.0, None), ("initech", 1.0, 1)],
        nodes=[NodeRow("n0", True, 16.0, 16384, [True] * 5)],
        allocations=[],
        jobs=[
            JobRow(UUID(int=k + 1), tenant, True, Demand(1, 1, 1.0, 1024), k % 3, 9 - k, None)
            for k, tenant in enumerate(["acme"] * 4 + ["globex"] * 4 + ["initech"] * 2)
        ],
        limit=8,
        policy=ClaimPolicy(Order.PRIORITY),
    )
)
@example(
    # Three learners, room for one and a half on each of two nodes: two fit, not three.
    world=World(
        tenants=[("t0", 1.0, None)],
        nodes=[NodeRow("n0", True, 8.0, 1500, []), NodeRow("n1", True, 8.0, 1500, [])],
        allocations=[],
        jobs=[JobRow(UUID(int=1), "t0", True, Demand(3, 0, 1.0, 1000), 0, 0, None)],
        limit=8,
    )
)
@example(
    # Four learners, two on each node: room for three here and two there takes them 2 + 2;
    # asked for four on a node, neither node has room for four, and it waits.
    world=World(
        tenants=[("t0", 1.0, None)],
        nodes=[NodeRow("n0", True, 3.0, 8192, []), NodeRow("n1", True, 2.0, 8192, [])],
        allocations=[],
        jobs=[
            JobRow(UUID(int=1), "t0", True, Demand(4, 0, 1.0, 1024, 2), 0, 0, None),
            JobRow(UUID(int=2), "t0", True, Demand(4, 0, 1.0, 1024, 4), 0, 1, None),
            JobRow(UUID(int=3), "t0", True, Demand(4, 0, 1.0, 1024), 0, 2, None),
        ],
        limit=8,
    )
)
async def test_the_sql_and_the_python_choose_the_same_jobs_in_the_same_order_under_any_policy(
    owner: asyncpg.Connection, world: World
) -> None:
    # One database for every example: each inserts its world in a transaction it rolls back.
    tx = owner.transaction()
    await tx.start()
    try:
        now: datetime = await owner.fetchval("SELECT now()")
        expected = await insert(owner, world, now)
        rows = await owner.fetch(Q["claim_candidates"], NODE, world.limit)
    finally:
        await tx.rollback()
    assert [row["job_id"] for row in rows] == [job.job_id for job in expected]


async def insert(conn: asyncpg.Connection, world: World, now: datetime) -> list[QueuedJob]:
    """Insert `world`; what the Python statement says the claim takes from it."""
    if world.policy is not None:
        # The row the `scheduling` projection keeps (tests/controlplane/scheduling/
        # test_switching.py sets it through the event).
        await conn.execute(
            "INSERT INTO scheduling_policy (claim_order, quotas, set_by, set_at) "
            "VALUES ($1, $2, 'test', $3)",
            str(world.policy.order),
            world.policy.quotas,
            T0,
        )
    await conn.executemany(
        "INSERT INTO tenants (name, weight, gpu_quota, created_at) VALUES ($1, $2, $3, $4)",
        [(name, weight, quota, T0) for name, weight, quota in world.tenants],
    )
    offered: dict[str, list[GpuInfo]] = {}
    for node in world.nodes:
        await conn.execute(
            "INSERT INTO nodes (name, agent_id, state, lease_until, heartbeat_at, "
            "registered_at, runtime, cpus, memory_mb) "
            "VALUES ($1, $2, $3, $4, $4, $4, 'process', $5, $6)",
            node.name,
            uuid4(),
            "READY" if node.ready else "LOST",
            now,
            node.cpus,
            node.memory_mb,
        )
        offered[node.name] = [
            GpuInfo(
                index=i, uuid=f"GPU-{node.name}-{i}", model="fake", memory_mb=80_000, healthy=ok
            )
            for i, ok in enumerate(node.healthy)
        ]
        await conn.executemany(
            "INSERT INTO node_gpus (node, index, uuid, model, memory_mb, healthy) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            [
                (node.name, g.index, g.uuid, g.model, g.memory_mb, g.healthy)
                for g in offered[node.name]
            ],
        )
    for job in world.jobs:
        manifest = {
            "learners": job.demand.learners,
            "gpus_per_learner": job.demand.gpus,
            "cpus": job.demand.cpus,
            "memory_mb": job.demand.memory_mb,
        }
        if job.demand.per_node is not None:
            manifest["learners_per_node"] = job.demand.per_node
        await conn.execute(
            "INSERT INTO job_status (job_id, tenant, name, state, attempt, restarts, priority, "
            "labels, submitted_at, updated_at, version, doc, not_before) "
            "VALUES ($1, $2, 'job', $3, 1, 0, $4, '{}', $5, $5, 1, $6, $7)",
            job.job_id,
            job.tenant,
            "QUEUED" if job.queued else "PROCESSING",
            job.priority,
            T0 + timedelta(seconds=job.submitted_s),
            json.dumps({"manifest": manifest}),
            None if job.backoff is None else now + timedelta(hours=job.backoff),
        )
    allocated: set[str] = set()
    held = {name: 0 for name, _, _ in world.tenants}
    used = {node.name: (0.0, 0) for node in world.nodes}
    claimed: set[UUID] = set()
    for k, a in enumerate(world.allocations):
        on = world.nodes[a.node].name
        if a.released:
            gpus = [f"GPU-gone-{k}-{i}" for i in range(a.gpus)]
        else:
            gpus = [g.uuid for g in offered[on] if g.uuid not in allocated][: a.gpus]
            allocated.update(gpus)
            held[a.tenant] += len(gpus)
            cpus, memory_mb = used[on]
            used[on] = (cpus + a.cpus, memory_mb + a.memory_mb)
        job_id = uuid4() if a.job is None else world.jobs[a.job].job_id
        if a.job is not None:
            claimed.add(job_id)  # released or not: the attempt was claimed
        await conn.execute(
            "INSERT INTO allocations (job_id, attempt, learner, tenant, node, epoch, gpus, "
            "cpus, memory_mb, released_at) VALUES ($1, 1, $2, $3, $4, 1, $5, $6, $7, $8)",
            job_id,
            k,
            a.tenant,
            on,
            gpus,
            a.cpus,
            a.memory_mb,
            now if a.released else None,
        )
        if not a.released:
            await conn.executemany(
                "INSERT INTO allocated_gpus (gpu_uuid, job_id, attempt, learner) "
                "VALUES ($1, $2, 1, $3)",
                [(gpu, job_id, k) for gpu in gpus],
            )
    ready = [
        Capacity(
            node.name,
            [g.uuid for g in allocatable(offered[node.name], allocated)],
            node.cpus - used[node.name][0],
            node.memory_mb - used[node.name][1],
        )
        for node in world.nodes
        if node.ready
    ]
    tenants = [
        TenantShare(name, weight, quota, held[name]) for name, weight, quota in world.tenants
    ]
    queue = [
        QueuedJob(
            job.job_id,
            job.tenant,
            job.demand,
            job.priority,
            T0 + timedelta(seconds=job.submitted_s),
            None if job.backoff is None else now + timedelta(hours=job.backoff),
            allocated=job.job_id in claimed,
        )
        for job in world.jobs
        if job.queued
    ]
    policy = DEFAULT if world.policy is None else world.policy
    return claim_order(NODE, ready, tenants, queue, limit=world.limit, now=now, policy=policy)


def rooms(name: str) -> st.SearchStrategy[Capacity]:
    return st.builds(
        Capacity,
        st.just(name),
        st.integers(0, 6).map(lambda n: [f"GPU-{name}-{i}" for i in range(n)]),
        st.sampled_from([0.3, 0.6, 0.9, 1.0, 1.2, 2.0, 3.0, 6.1, 8.0]),
        st.integers(100, 5000),
    )


@st.composite
def any_demands(draw: st.DrawFn) -> Demand:
    learners = draw(st.integers(1, 12))
    return Demand(
        learners,
        draw(st.integers(0, 2)),
        draw(st.sampled_from([0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 1.0, 1.5, 3.3])),
        draw(st.integers(16, 2000)),
        draw(per_node(learners)),
    )


@settings(max_examples=2000)
@given(
    demand=any_demands(),
    here=rooms("n0"),
    others=st.lists(st.integers(1, 3), max_size=2, unique=True).flatmap(
        lambda names: st.tuples(*(rooms(f"n{i}") for i in names))
    ),
)
def test_a_job_the_order_offers_the_claim_can_place(
    demand: Demand, here: Capacity, others: tuple[Capacity, ...]
) -> None:
    # Else the claim finds its first candidate unplaceable, rolls back and retries, and the
    # node takes nothing while that job heads its queue.
    if fits(demand, here, [here, *others]):
        assert place(demand, [here, *others]) is not None


@settings(max_examples=500)
@given(
    # Memory alone bounds a node here: room for 0 to 12 learners each.
    demand=any_demands()
    .filter(lambda demand: demand.per_node is not None)
    .map(lambda demand: replace(demand, gpus=0)),
    nodes=st.lists(st.integers(0, 12), min_size=1, max_size=6),
)
def test_with_learners_per_node_each_node_takes_that_many_learners_or_none_in_rank_order(
    demand: Demand, nodes: list[int]
) -> None:
    rooms = [Capacity(f"n{i}", [], 100.0, room * demand.memory_mb) for i, room in enumerate(nodes)]
    placed = place(demand, rooms)
    assert demand.per_node is not None
    if placed is None:
        # Only when fewer nodes than the job needs have room for `per_node` learners.
        assert sum(room >= demand.per_node for room in nodes) < demand.learners // demand.per_node
        return
    on = [learner.node for learner in placed]
    assert {on.count(node) for node in on} == {demand.per_node}
    # Each node's learners are consecutive indices: RANK = NODE_RANK x per_node + LOCAL_RANK.
    order = list(dict.fromkeys(on))
    assert [learner.index for learner in placed] == list(range(demand.learners))
    assert [order.index(node) for node in on] == [k // demand.per_node for k in range(len(on))]


def test_placement_counts_cpus_as_the_sql_does() -> None:
    # 1.0 // 0.2 is 4.0 in floating point; the SQL's floor(1.0 / 0.2) is 5.
    placed = place(Demand(5, 0, 0.2, 16), [Capacity("n0", [], 1.0, 1000)])
    assert placed is not None and len(placed) == 5


def test_the_scheduling_modules_import_no_database_driver() -> None:
    # The simulator runs them without a database, and an agent's reconcile planner and the
    # aggregates' pure decisions (with the command path and the clock) are tested without
    # one; a fresh interpreter, so that what other tests imported does not count.
    scheduling = (
        "claim",
        "claim_order",
        "events",
        "lifecycle",
        "placement",
        "policy",
        "streams",
        "unschedulable",
    )
    # Model search is pure too, for its reference evaluation and property tests: SQLAlchemy
    # Core and its postgresql dialect, which load no driver until an engine asks for one.
    search = ("query", "reference", "sql")
    modules = ", ".join(
        [
            *(f"controlplane.scheduling.{name}" for name in scheduling),
            *(f"controlplane.models.query.{name}" for name in search),
            "controlplane.clock",
            "controlplane.events.commands",
            "controlplane.events.memory",
            "controlplane.jobs.lifecycle",
            "controlplane.models.lifecycle",
            "controlplane.models.metadata",
            "controlplane.models.references",
            "controlplane.tenants.state",
            "node_agent.reconcile",
        ]
    )
    code = f"import sys, {modules}; print('asyncpg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
