"""The lifecycle manager: one active replica, which alone runs every registered sweep, in order,
one failing step stopping none of the others; failover, node loss restarts jobs elsewhere, a
hiccup shorter than the lease restarts nothing, a returning node kills its stale learners, and
logs past their retention are forgotten."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from controlplane.agents.claims import claim
from controlplane.agents.events import NodeLost
from controlplane.agents.lost_nodes import LostNodes
from controlplane.agents.manager import LifecycleManager
from controlplane.events.store import EventStore
from controlplane.jobs.events import JobEvent, JobRestarted
from controlplane.jobs.lifecycle import JobStatus
from controlplane.sweeps import Tenure
from node_agent.service import LeaseLost
from tests.cluster import Plane, RunningAgent, agent_config
from tests.controlplane.agents.test_claims import Cluster, manifest
from tests.controlplane.logs.test_log_retention import jobs_with_logs, make_history
from tests.managers import lifecycle_manager
from tests.node_agent.test_agent import SLEEPER, wait_for_line
from tests.polling import eventually


@pytest.fixture
async def managers(
    pool: asyncpg.Pool, store: EventStore, db_url: str
) -> AsyncIterator[list[LifecycleManager]]:
    """Two replicas' managers, running."""
    running = [lifecycle_manager(db_url, pool, store, interval_s=0.1) for _ in range(2)]
    tasks = [asyncio.create_task(m.run()) for m in running]
    yield running
    for manager in running:
        manager.stop()
    await asyncio.wait(tasks, timeout=5)


async def test_exactly_one_manager_is_active_and_another_takes_over(
    managers: list[LifecycleManager], owner: asyncpg.Connection
) -> None:
    async def one_active() -> bool:
        return sum(m.active for m in managers) == 1

    await eventually(one_active, seconds=5)
    await asyncio.sleep(0.5)
    assert sum(m.active for m in managers) == 1  # and it stays so
    active = next(m for m in managers if m.active)
    # Its session (which holds the lock) dies, as when its replica is killed.
    killed = await owner.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_locks"
        " WHERE locktype = 'advisory' AND granted AND database = ("
        "   SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    assert killed == 1

    async def other_took_over() -> bool:
        return any(m.active for m in managers if m is not active)

    await eventually(other_took_over, seconds=5)


MANAGER_LOCKS = """
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND ((classid::bigint << 32) | objid::bigint)
      = hashtextextended('trainyard.lifecycle-manager', 0)
"""
"""Sessions holding this database's manager lock (the key of `manager_lock` in
agents/queries.sql, as pg_locks splits a bigint key; pg_locks lists every database's, and the
server is shared with other tests' control planes)."""


@dataclass(frozen=True)
class Run:
    step: str
    manager: int
    locks: int


class Recording:
    """A sweep that records each run: which manager ran it, and how many sessions then held
    the manager lock."""

    def __init__(self, name: str, manager: int, pool: asyncpg.Pool, runs: list[Run]) -> None:
        self.name = name
        self._manager = manager
        self._pool = pool
        self._runs = runs

    async def step(self, tenure: Tenure) -> None:
        locks = await self._pool.fetchval(MANAGER_LOCKS)
        self._runs.append(Run(self.name, self._manager, locks))


class Broken:
    """A sweep with a bug."""

    name = "broken"

    async def step(self, tenure: Tenure) -> None:
        raise RuntimeError("a bug in one feature's step")


async def test_the_active_manager_alone_runs_every_sweep_in_order_past_a_failing_one(
    pool: asyncpg.Pool, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[Run] = []
    managers = [
        LifecycleManager(
            db_url,
            [
                Recording("first", n, pool, runs),
                Broken(),
                Recording("last", n, pool, runs),
            ],
            interval_s=0.1,
        )
        for n in range(2)
    ]
    async with asyncio.TaskGroup() as group:
        for manager in managers:
            group.create_task(manager.run())

        async def swept_thrice() -> bool:
            return sum(run.step == "last" for run in runs) >= 3

        await eventually(swept_thrice, seconds=10)
        active = [manager.active for manager in managers]
        for manager in managers:
            manager.stop()
    # The active manager swept, never the other.
    assert {run.manager for run in runs} == {active.index(True)}
    assert active.count(True) == 1
    # Every step ran under the lock (held by the one session), in the registry's order, and
    # the broken step, logged each sweep, stopped neither the step after it nor later sweeps.
    assert {run.locks for run in runs} == {1}
    steps = [run.step for run in runs]
    assert steps[: len(steps) // 2 * 2] == ["first", "last"] * (len(steps) // 2)
    failures = caplog.text.count("lifecycle-manager: its step for the broken step failed")
    assert failures >= 3
    assert "a bug in one feature's step" in caplog.text


async def test_an_expired_lease_marks_the_node_lost_and_restarts_its_jobs_elsewhere(
    pool: asyncpg.Pool, store: EventStore, db_url: str, owner: asyncpg.Connection
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    await cluster.node("n1", 1)
    job_id = await cluster.submit("acme", manifest(1))
    await cluster.project()
    assert len(await claim(pool, store, "n1")) == 1
    lost = LostNodes(pool, store)
    assert await lost.declare_expired() == []  # the lease is live: nothing happens

    warm = await owner.fetchrow("SELECT * FROM hold_warm_uid('n1', 7000, 10)")
    assert warm is not None  # a warm sandbox's uid, held for n1

    await owner.execute("UPDATE nodes SET lease_until = now() - interval '1 second'")
    assert await lost.declare_expired() == ["n1"]
    assert await lost.declare_expired() == []  # once
    # Its warm uids go back with it: no agent of n1 may ever start again to give them back.
    assert await owner.fetchval("SELECT count(*) FROM warm_uids") == 0
    assert (
        await owner.fetchval(
            "SELECT count(*) FROM learner_uids WHERE job_id = $1", warm["placeholder"]
        )
        == 0
    )

    assert await owner.fetchval("SELECT state FROM nodes WHERE name = 'n1'") == "LOST"
    node_events = [e.event for e in await store.read_stream("node-n1")]
    assert isinstance(node_events[-1], NodeLost)
    job = [e.event for e in await store.read_stream(f"job-{job_id}")]
    assert isinstance(job[-1], JobRestarted)
    assert job[-1].reason == "node_lost: node n1 stopped renewing its lease"
    assert job[-1].attempt == 2
    assert await owner.fetchval("SELECT count(*) FROM allocated_gpus") == 0

    # Claimed again on another node, as attempt 2.
    await cluster.node("n2", 1)

    async def claimed_elsewhere() -> bool:
        # Projected again each time: a transaction open elsewhere on the shared server may hold
        # the restart back from one projection pass (the log is gap-free), not from the next.
        await cluster.project()
        again = await claim(pool, store, "n2")
        return [(c.job.job_id, c.attempt) for c in again] == [(job_id, 2)]

    await eventually(claimed_elsewhere)


async def test_a_returning_node_kills_its_stale_learners_and_reports_nothing(
    plane: Plane, tmp_path: Path, owner: asyncpg.Connection
) -> None:
    agent = await RunningAgent(plane.url, agent_config(tmp_path), fake_gpus=1).started()
    job_id = await plane.submit(SLEEPER)
    await plane.state(job_id, JobStatus.PROCESSING)
    await wait_for_line(plane, job_id, "ready")
    # The node misses its heartbeats for longer than its lease (simulated), and a manager
    # declares it lost; the agent finds out at its next heartbeat.
    await owner.execute("UPDATE nodes SET lease_until = now() - interval '1 second'")
    assert await LostNodes(plane.pool, plane.store).declare_expired() == ["n1"]
    with pytest.raises(LeaseLost, match="lost its lease"):
        await asyncio.wait_for(agent.task, 20)
    await wait_for_line(plane, job_id, "terminating")  # the stale learner was stopped
    job = await plane.state(job_id, JobStatus.QUEUED)
    assert job.attempt == 2
    # Nothing from the fenced attempt after its restart: no Restart("node agent stopped").
    history = [e.event for e in await plane.store.read_stream(f"job-{job_id}")]
    assert isinstance(history[-1], JobRestarted)
    assert sum(isinstance(e, JobRestarted) for e in history if isinstance(e, JobEvent)) == 1


async def test_a_sweep_forgets_the_logs_of_jobs_that_ended_before_the_retention(
    pool: asyncpg.Pool, store: EventStore, db_url: str, owner: asyncpg.Connection
) -> None:
    history = await make_history(pool, store, db_url, owner)
    every = {*history.old.values(), *history.kept.values()}
    # 0: kept forever.
    await lifecycle_manager(db_url, pool, store, log_retention_s=0).sweep()
    assert (await jobs_with_logs(owner))["job_logs"] == every
    # The default, 30 days: those that ended 40 days ago go.
    await lifecycle_manager(db_url, pool, store).sweep()
    assert (await jobs_with_logs(owner))["job_logs"] == set(history.kept.values())


async def test_a_node_whose_job_cannot_be_read_leaves_the_other_nodes_declared_lost(
    pool: asyncpg.Pool,
    store: EventStore,
    db_url: str,
    owner: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One job's data stops one node's step, never the sweep (before, the error escaped the
    manager and stopped every background worker): here its stream holds an event this version
    cannot read (as a newer replica writes during a rolling upgrade)."""
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    jobs = {}
    for node in ("n1", "n2"):
        await cluster.node(node, 1)
        jobs[node] = await cluster.submit("acme", manifest(1))
        await cluster.project()
        assert len(await claim(pool, store, node)) == 1
    unreadable = f"job-{jobs['n1']}"
    await owner.execute(
        "INSERT INTO events (stream_id, stream_version, type, schema_version, data, metadata)"
        " SELECT stream_id, stream_version + 1, type, 99, data, metadata FROM events"
        " WHERE stream_id = $1 ORDER BY stream_version DESC LIMIT 1",
        unreadable,
    )
    await owner.execute("UPDATE nodes SET lease_until = now() - interval '1 second'")

    lost = LostNodes(pool, store)
    assert await lost.declare_expired() == ["n2"]
    job = [e.event for e in await store.read_stream(f"job-{jobs['n2']}")]
    assert isinstance(job[-1], JobRestarted)
    # n1's step rolled back whole (still READY, its job's allocation held), tried each sweep.
    assert await owner.fetchval("SELECT state FROM nodes WHERE name = 'n1'") != "LOST"
    assert "lifecycle-manager: its step for node n1 failed" in caplog.text
    assert await lost.declare_expired() == []
