"""Claims: concurrent agents never double-claim a job or a GPU; fair share across tenants by
weight; quotas; and what a claim records."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from uuid import UUID, uuid4

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.agents.claims import Releases, claim
from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import Nodes, NodeSpec
from controlplane.clock import SYSTEM_CLOCK
from controlplane.database import AGENT_ROLE, create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.events import JobDeploying
from controlplane.jobs.lifecycle import Cancel, Complete, EnterPhase, JobStatus, Restart
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.projection import JobsProjection
from controlplane.jobs.service import Jobs
from controlplane.jobs.streams import job_stream
from controlplane.projections.runner import ProjectionRunner
from controlplane.scheduling.claim import Claim
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import create_tenant
from tests.conftest import fresh_store
from tests.polling import eventually

AGENT = Metadata(actor="agent:test")


def manifest(gpus: int = 1, learners: int = 1, **extra: object) -> JobManifest:
    return JobManifest.model_validate(
        {
            "name": "job",
            "image": "img",
            "command": ["train"],
            "gpus_per_learner": gpus,
            "learners": learners,
            "cpus": 1,
            "memory_mb": 1024,
            **extra,
        }
    )


class Cluster:
    """Real nodes (fake GPUs), tenants and jobs in one test database."""

    def __init__(self, pool: asyncpg.Pool, store: EventStore, db_url: str) -> None:
        self.pool = pool
        self.store = store
        self.jobs = Jobs(store)
        self.nodes = Nodes(pool, store)
        self.submitted = 0
        self.runner = ProjectionRunner(
            pool, store, LogListener(db_url), [JobsProjection(), TenantsProjection()]
        )

    async def node(self, name: str, gpus: int, cpus: float = 64, memory_mb: int = 1 << 20) -> None:
        inventory = [
            GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model="fake", memory_mb=80_000, healthy=True)
            for i in range(gpus)
        ]
        spec = NodeSpec(name, uuid4(), "process", cpus, memory_mb, inventory)
        await self.nodes.register(spec, ttl_s=60)

    async def tenant(self, name: str, weight: float = 1, quota: int | None = None) -> None:
        await create_tenant(self.store, self.runner, name, weight, quota, actor="test")

    async def submit(self, tenant: str, job: JobManifest) -> UUID:
        submitted, _ = await self.jobs.submit(tenant, job, Metadata(actor="test", tenant=tenant))
        self.submitted += 1
        return submitted.job_id

    async def project(self) -> None:
        """Until the queue (a projection) holds every submitted job: a transaction open
        anywhere on the server may hold the newest events back for a moment."""

        async def queued() -> bool:
            for projection in self.runner.projections.values():
                await self.runner.catch_up(projection)
            count: int = await self.pool.fetchval("SELECT count(*) FROM job_status")
            return count == self.submitted

        await eventually(queued)

    async def finish(self, won: Claim) -> None:
        job_id = won.job.job_id
        await self.jobs.execute(job_id, EnterPhase(JobStatus.PROCESSING, SYSTEM_CLOCK.now()), AGENT)
        await self.jobs.execute(
            job_id, Complete([0] * len(won.learners), SYSTEM_CLOCK.now()), AGENT
        )
        for node in won.nodes:
            await Releases(self.pool, node).release(job_id, won.attempt)


async def claim_all(cluster: Cluster, node_names: list[str]) -> list[tuple[str, Claim]]:
    """Every node claims concurrently, as often as work fits, until a round in which no node
    claims anything (a node finds nothing while another's claim holds jobs it then leaves; an
    agent looks again when that claim's event wakes it)."""
    won: list[tuple[str, Claim]] = []

    async def agent(name: str) -> None:
        while result := await claim(cluster.pool, cluster.store, name):
            won.extend((name, taken) for taken in result)

    while True:
        before = len(won)
        await asyncio.gather(*(agent(name) for name in node_names))
        if len(won) == before:
            return won


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    node_sizes=st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=4),
    jobs=st.lists(
        st.tuples(st.integers(min_value=0, max_value=3), st.integers(min_value=1, max_value=2)),
        min_size=1,
        max_size=14,
    ),
)
async def test_concurrent_claims_never_share_a_job_or_a_gpu(
    pg_server: str, template_db: str, node_sizes: list[int], jobs: list[tuple[int, int]]
) -> None:
    async with fresh_store(pg_server, template_db, pool_size=10) as (url, pool, store):
        await check_claims(Cluster(pool, store, url), node_sizes, jobs)


async def check_claims(
    cluster: Cluster, node_sizes: list[int], jobs: list[tuple[int, int]]
) -> None:
    store = cluster.store
    names = [f"n{i}" for i in range(len(node_sizes))]
    for name, size in zip(names, node_sizes, strict=True):
        await cluster.node(name, size)
    tenant = "acme"
    await cluster.tenant(tenant)
    submitted = [await cluster.submit(tenant, manifest(g, n)) for g, n in jobs]
    await cluster.project()

    won = await claim_all(cluster, names)

    claimed = [c.job.job_id for _, c in won]
    assert len(claimed) == len(set(claimed)), "a job was claimed twice"
    assert set(claimed) <= set(submitted)
    gpus = [g for _, c in won for learner in c.learners for g in learner.gpus]
    assert len(gpus) == len(set(gpus)), "a GPU was given twice"
    for name, c in won:
        # Learners on their nodes' own GPUs; the claiming node runs the first, and a job that
        # fits on it runs there whole.
        assert all(g.startswith(f"GPU-{a.node}-") for a in c.learners for g in a.gpus)
        assert c.learners[0].node == name
        if len(c.nodes) > 1:
            assert c.job.manifest.learners > 1
        need = c.job.manifest.learners * c.job.manifest.gpus_per_learner
        assert len(c.gpus) == need
    # The log agrees: exactly one DEPLOYING per claimed job, none for the others.
    for job_id in submitted:
        history = await store.read_stream(job_stream(job_id))
        deploys = [e for e in history if isinstance(e.event, JobDeploying)]
        assert len(deploys) == (1 if job_id in claimed else 0)
    # Every job that still waits could not have fit in what was left.
    capacity = dict(zip(names, node_sizes, strict=True))
    for _, c in won:
        for learner in c.learners:
            capacity[learner.node] -= len(learner.gpus)
    for (g, n), job_id in zip(jobs, submitted, strict=True):
        if job_id not in claimed:
            room = [left // g for left in capacity.values()] if g else [n]
            # All on one node, or (several learners) spread over nodes with room for one each.
            assert max(room) < n and (n == 1 or sum(room) < n)


async def share_of_gpu_time(
    cluster: Cluster, weights: dict[str, float], rounds: int
) -> Counter[str]:
    """Both tenants keep a deep backlog of 1-GPU jobs that all run equally long: each round the
    oldest running job finishes and its GPU is claimed again, so claims count GPU time."""
    for name, weight in weights.items():
        await cluster.tenant(name, weight)
    rng = random.Random(7)
    order = [name for name in weights for _ in range(60)]
    rng.shuffle(order)
    for name in order:
        await cluster.submit(name, manifest(1))
    nodes = ["a", "b", "c"]
    for name in nodes:
        await cluster.node(name, 2)
    await cluster.project()
    running = [c for _, c in await claim_all(cluster, nodes)]
    assert len(running) == 6
    used: Counter[str] = Counter()
    for _ in range(rounds):
        finished = running.pop(0)
        used[finished.job.tenant] += 1
        await cluster.finish(finished)
        running += [c for _, c in await claim_all(cluster, nodes)]
    return used


async def test_fair_share_with_equal_weights(
    pool: asyncpg.Pool, store: EventStore, db_url: str
) -> None:
    used = await share_of_gpu_time(Cluster(pool, store, db_url), {"acme": 1, "globex": 1}, 60)
    assert sum(used.values()) == 60
    assert abs(used["acme"] - used["globex"]) <= 0.1 * 30


async def test_fair_share_follows_weights(
    pool: asyncpg.Pool, store: EventStore, db_url: str
) -> None:
    used = await share_of_gpu_time(Cluster(pool, store, db_url), {"acme": 2, "globex": 1}, 60)
    assert 1.7 <= used["acme"] / used["globex"] <= 2.3


async def test_quota_priority_and_what_a_claim_records(
    pool: asyncpg.Pool, store: EventStore, db_url: str, owner: asyncpg.Connection
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme", quota=1)
    await cluster.tenant("globex")
    first = await cluster.submit("acme", manifest(1))
    over_quota = await cluster.submit("acme", manifest(1))
    low = await cluster.submit("globex", manifest(1, priority=-5))
    high = await cluster.submit("globex", manifest(1, priority=5))
    cancelled = await cluster.submit("globex", manifest(1, priority=50))
    await cluster.jobs.execute(cancelled, Cancel("changed my mind", SYSTEM_CLOCK.now()), AGENT)
    await cluster.node("n1", 2)
    await cluster.project()

    won = [c for _, c in await claim_all(cluster, ["n1"])]
    # Fair share first (both tenants hold nothing: acme's oldest, then globex by priority),
    # acme's quota of 1 GPU keeps its second job waiting; the cancelled job is never claimed.
    assert {c.job.job_id for c in won} == {first, high}
    assert over_quota not in {c.job.job_id for c in won} and low not in {c.job.job_id for c in won}
    epochs = [c.epoch for c in won]
    assert len(set(epochs)) == 2
    for c in won:
        assert c.job.state is JobStatus.DEPLOYING
        assert c.job.nodes == ["n1"] and c.job.epoch == c.epoch
        rows = await owner.fetch(
            "SELECT gpu_uuid FROM allocated_gpus WHERE job_id = $1", c.job.job_id
        )
        assert [r["gpu_uuid"] for r in rows] == c.job.gpus

    # Releasing gives the GPU back: the next fitting job (acme's, now within quota) is claimed.
    acme = next(c for c in won if c.job.job_id == first)
    await cluster.finish(acme)
    again = [c for _, c in await claim_all(cluster, ["n1"])]
    assert [c.job.job_id for c in again] == [over_quota]


async def test_a_restarted_job_waits_out_its_backoff(
    pool: asyncpg.Pool, store: EventStore, db_url: str
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    await cluster.node("n1", 1)
    job_id = await cluster.submit("acme", manifest(1))
    await cluster.project()
    [(_, first)] = await claim_all(cluster, ["n1"])
    await cluster.jobs.execute(job_id, EnterPhase(JobStatus.PROCESSING, SYSTEM_CLOCK.now()), AGENT)
    await cluster.jobs.execute(
        job_id, Restart("learner 0 killed by SIGKILL", SYSTEM_CLOCK.now(), 2.0), AGENT
    )
    await Releases(pool, "n1").release(job_id, first.attempt)

    async def requeued() -> bool:
        await cluster.project()
        state = await pool.fetchval("SELECT state FROM job_status WHERE job_id = $1", job_id)
        return bool(state == "QUEUED")

    await eventually(requeued)
    assert await claim(pool, store, "n1") == []  # still backing off
    await asyncio.sleep(2.1)
    [again] = await claim(pool, store, "n1")
    assert again.job.job_id == job_id and again.attempt == 2


async def test_a_job_without_a_free_uid_waits_queued_and_one_that_holds_its_uid_is_claimed(
    pool: asyncpg.Pool, store: EventStore, db_url: str
) -> None:
    one = range(300000, 300001)  # a range of one uid
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    await cluster.node("n1", 1)
    await cluster.node("n2", 1)
    # Claims as agents make them: uids are the agents' to allocate.
    agents = await create_pool(db_url, min_size=1, max_size=2, role=AGENT_ROLE)
    agent_store = EventStore(agents, EVENT_REGISTRY)
    first = await cluster.submit("acme", manifest(1))
    await cluster.project()
    [won] = await claim(agents, agent_store, "n1", uids=one)
    second = await cluster.submit("acme", manifest(1))
    await cluster.project()
    # n2's GPU is free, but the only uid is the first job's: the second stays queued.
    assert await claim(agents, agent_store, "n2", uids=one) == []
    state = await pool.fetchval("SELECT state FROM job_status WHERE job_id = $1", second)
    assert state == "QUEUED"
    # Restarted, the first job is claimed again with the uid it holds, ahead of the second.
    await cluster.jobs.execute(first, EnterPhase(JobStatus.PROCESSING, SYSTEM_CLOCK.now()), AGENT)
    await cluster.jobs.execute(first, Restart("node lost", SYSTEM_CLOCK.now(), 0.0), AGENT)
    await Releases(pool, "n1").release(first, won.attempt)

    async def requeued() -> bool:
        await cluster.project()
        state = await pool.fetchval("SELECT state FROM job_status WHERE job_id = $1", first)
        return bool(state == "QUEUED")

    await eventually(requeued)
    [again] = await claim(agents, agent_store, "n2", uids=one)
    assert (again.job.job_id, again.attempt) == (first, 2)
    held = await pool.fetch("SELECT uid, job_id FROM learner_uids")
    assert [(r["uid"], r["job_id"]) for r in held] == [(300000, first)]
    await agent_store.close()
    await agents.close()


async def test_one_claim_takes_what_fits_together_in_fair_share_order(
    pool: asyncpg.Pool, store: EventStore, db_url: str, owner: asyncpg.Connection
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    await cluster.tenant("globex")
    await cluster.tenant("initech", quota=1)
    acme = [await cluster.submit("acme", manifest(1)) for _ in range(4)]
    globex = [await cluster.submit("globex", manifest(1)) for _ in range(4)]
    initech = [await cluster.submit("initech", manifest(1)) for _ in range(2)]
    await cluster.node("n1", 5)
    await cluster.project()

    won = await claim(pool, store, "n1")
    # One transaction, taken in the order claims one by one would have taken them: the tenant
    # holding least goes next (ties by submission), and initech's quota stops it at one GPU.
    assert [c.job.job_id for c in won] == [acme[0], globex[0], initech[0], acme[1], globex[1]]
    assert len({c.version for c in won}) == 1 and len({c.epoch for c in won}) == 5
    assert sorted(g for c in won for g in c.gpus) == [f"GPU-n1-{i}" for i in range(5)]
    xids = await owner.fetch(
        "SELECT DISTINCT xid FROM events WHERE type = $1", JobDeploying.type_name
    )
    assert len(xids) == 1
    assert await claim(pool, store, "n1") == []  # the node is full


async def test_a_claim_leaves_what_does_not_fit_beside_the_jobs_before_it(
    pool: asyncpg.Pool, store: EventStore, db_url: str
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    big = await cluster.submit("acme", manifest(2))
    also_big = await cluster.submit("acme", manifest(2))
    small = await cluster.submit("acme", manifest(1))
    await cluster.node("n1", 3)
    await cluster.project()

    won = await claim(pool, store, "n1")
    assert [c.job.job_id for c in won] == [big, small]
    assert len(won[0].gpus) == 2 and len(won[1].gpus) == 1
    await cluster.project()
    state = await pool.fetchval("SELECT state FROM job_status WHERE job_id = $1", also_big)
    assert state == "QUEUED"


async def test_a_node_s_releases_made_at_once_go_together(
    pool: asyncpg.Pool, store: EventStore, db_url: str, owner: asyncpg.Connection
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    for _ in range(4):
        await cluster.submit("acme", manifest(1))
    await cluster.node("n1", 4)
    await cluster.project()
    won = await claim(pool, store, "n1")
    assert len(won) == 4
    releases = Releases(pool, "n1")
    await asyncio.gather(*(releases.release(c.job.job_id, c.attempt) for c in won))
    assert await owner.fetchval("SELECT count(*) FROM allocated_gpus") == 0
    released = await owner.fetch("SELECT DISTINCT released_at FROM allocations")
    assert len(released) == 1 and released[0]["released_at"] is not None  # one statement
    # Released twice, or by another node, changes nothing.
    await Releases(pool, "n2").release(won[0].job.job_id, won[0].attempt)
    await releases.release(won[0].job.job_id, won[0].attempt)
    assert await owner.fetch("SELECT DISTINCT released_at FROM allocations") == released


async def test_a_gang_that_fits_only_in_halves_of_learners_does_not_stop_the_claims(
    pool: asyncpg.Pool, store: EventStore, db_url: str
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    # Room for one and a half learners on each node: two in all, not three.
    gang = await cluster.submit("acme", manifest(0, 3, memory_mb=1000))
    small = await cluster.submit("acme", manifest(0, 1, memory_mb=500))
    await cluster.node("n1", 0, memory_mb=1500)
    await cluster.node("n2", 0, memory_mb=1500)
    await cluster.project()

    won = await claim(pool, store, "n1")
    assert [c.job.job_id for c in won] == [small]
    await cluster.project()
    state = await pool.fetchval("SELECT state FROM job_status WHERE job_id = $1", gang)
    assert state == "QUEUED"


async def test_a_gang_spreads_where_memory_bounds_the_claiming_node(
    pool: asyncpg.Pool, store: EventStore, db_url: str
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    gang = await cluster.submit("acme", manifest(0, 3, memory_mb=1000))
    await cluster.node("n1", 0, memory_mb=1500)
    await cluster.node("n2", 0, memory_mb=4000)
    await cluster.project()

    [won] = await claim(pool, store, "n1")
    assert won.job.job_id == gang
    assert [learner.node for learner in won.learners] == ["n1", "n2", "n2"]


async def test_learners_per_node_places_that_many_on_each_node(
    pool: asyncpg.Pool, store: EventStore, db_url: str
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    # Room for all four on n1; asked for two a node, it takes two nodes.
    job = await cluster.submit("acme", manifest(1, 4, learners_per_node=2))
    await cluster.node("n1", 4)
    await cluster.node("n2", 4)
    await cluster.project()

    [won] = await claim(pool, store, "n1")
    assert won.job.job_id == job
    assert [learner.node for learner in won.learners] == ["n1", "n1", "n2", "n2"]
    rows = await pool.fetch(
        "SELECT node, count(*) AS learners FROM allocations WHERE job_id = $1 "
        "GROUP BY node ORDER BY node",
        job,
    )
    assert [(r["node"], r["learners"]) for r in rows] == [("n1", 2), ("n2", 2)]


async def test_a_job_of_four_learners_per_node_waits_for_a_node_with_room_for_four(
    pool: asyncpg.Pool, store: EventStore, db_url: str
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    whole = await cluster.submit("acme", manifest(1, 4, learners_per_node=4))
    await cluster.node("n1", 3)
    await cluster.node("n2", 3)
    await cluster.project()

    # Three GPUs on each node would hold its four learners split; it asked not to be.
    assert await claim(pool, store, "n1") == []
    assert await claim(pool, store, "n2") == []
    await cluster.node("n3", 4)
    assert await claim(pool, store, "n1") == []
    [won] = await claim(pool, store, "n3")
    assert won.job.job_id == whole
    assert [learner.node for learner in won.learners] == ["n3"] * 4


async def test_a_node_with_room_for_fewer_than_learners_per_node_takes_none_of_the_job(
    pool: asyncpg.Pool, store: EventStore, db_url: str
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    # Two on each of two nodes: n1's room for three holds two (its third GPU stays free for
    # other jobs), n2's room for one holds none, so the job waits rather than go 3 + 1.
    pairs = await cluster.submit("acme", manifest(1, 4, learners_per_node=2))
    await cluster.node("n1", 3)
    await cluster.node("n2", 1)
    await cluster.project()

    assert await claim(pool, store, "n1") == []
    assert await claim(pool, store, "n2") == []
    await cluster.node("n3", 2)
    [won] = await claim(pool, store, "n1")
    assert won.job.job_id == pairs
    assert [learner.node for learner in won.learners] == ["n1", "n1", "n3", "n3"]
    # Without learners_per_node a job of two goes where they fit: n1's third GPU and n2's one.
    spread = await cluster.submit("acme", manifest(1, 2))
    await cluster.project()
    [won] = await claim(pool, store, "n1")
    assert won.job.job_id == spread
    assert [learner.node for learner in won.learners] == ["n1", "n2"]
