"""A node's lease across a database outage longer than its TTL, with real parts: Patroni and
etcd (`harness.ha`), a served control plane and two process-runtime agents on the multi-host
URL, each running a learner.

The lifecycle manager (controlplane/agents/manager.py) loses its session when the primary
dies; when it takes its lock again on the new primary, it counts each lease's TTL from that
primary's now() too (`expired_nodes`), so an agent has a whole TTL after the failover to
heartbeat again, however long the outage was. A plain server stopped and started would take
the manager through the same code (it only sees its session lost, then its lock taken again);
this test does a real failover, with Patroni paused (maintenance mode) for a chosen outage.

Why it fails with leases measured from the old primary's timestamps (`lease_until` alone):
the outage outlasts the TTL, so the agent's last `lease_until` has passed when the new primary
takes writes. The kept agent is stopped (SIGSTOP) for the outage and until the manager has
swept on the new primary for two intervals, its learner running on; only then does it go on
and heartbeat. A manager counting from `lease_until` declares it LOST in those sweeps (its
learner then killed, its job restarted); the test checks that the lease had passed by then,
so it cannot pass by the agent heartbeating first. The other agent is killed for good: it is
declared LOST all the same, a TTL after the new primary's manager took over."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from controlplane.agents.events import NodeLost
from controlplane.agents.nodes import node_stream
from controlplane.database import create_pool
from controlplane.jobs.lifecycle import Job, JobStatus
from harness import processes
from harness.agent_process import AgentProcess
from harness.ha import HaCluster, ha_cluster, missing
from harness.processes import Cluster, counter, until
from node_agent.process_runtime import find_learners
from tests.cluster import learner_space

pytestmark = [pytest.mark.postgres, pytest.mark.processes]

TTL_S = 6.0
HEARTBEAT_S = 0.5
OUTAGE_S = TTL_S + 1
"""From the kill of the primary to Patroni being told to fail over: the lease's last end has
passed before a new primary takes writes."""
SWEEPS_S = 2.5
"""How long the kept agent stays stopped once the manager holds its lock on the new primary:
two of its sweeps (one a second, the first at once), and TTL_S - SWEEPS_S left to heartbeat."""
MANAGER_ACTIVE = """
SELECT now() FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND ((classid::bigint << 32) | objid::bigint)
      = hashtextextended('trainyard.lifecycle-manager', 0)
"""
"""The new primary's now() while a lifecycle manager holds its lock there (the key of
`manager_lock` in controlplane/agents/queries.sql, as pg_locks splits a bigint key)."""


@pytest.fixture(autouse=True)
def _needs_patroni() -> None:
    problem = missing()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the lease grace test: {problem}")
        pytest.skip(problem)


@asynccontextmanager
async def replicated() -> AsyncIterator[tuple[HaCluster, Cluster]]:
    async with ha_cluster() as ha:
        pool = await create_pool(ha.url(), min_size=1, max_size=3)
        try:
            async with processes.cluster(ha.url(), learner_space(), pool) as running:
                yield ha, running
        finally:
            await pool.close()


def whole_node() -> dict[str, Any]:
    """A long job that takes every CPU of a node (an agent offers the machine's): the next job
    goes to another node."""
    return {**counter(steps=1_000_000, step_s=0.1), "cpus": float(os.cpu_count() or 1)}


async def start_on(running: Cluster, agent: AgentProcess) -> tuple[UUID, str]:
    """A whole-node job, started on `agent` (the only node with room); its learner's handle."""
    job_id = await running.submit(whole_node(), running.planes[0])
    await running.until_job(job_id, lambda job: job.state is JobStatus.PROCESSING)
    learner = await running.learner(job_id, 1)
    assert job_id in {f.job_id for f in find_learners(agent.name, agent.work_dir)}
    return job_id, learner.handle


async def renewed(pool: asyncpg.Pool, node: str) -> bool | None:
    """True once the node is READY with a lease that has not ended."""
    live: bool | None = await pool.fetchval(
        "SELECT true FROM nodes WHERE name = $1 AND state = 'READY' AND lease_until > now()", node
    )
    return live


async def lost_at(running: Cluster, node: str) -> datetime | None:
    for recorded in await running.store.read_stream(node_stream(node)):
        if isinstance(recorded.event, NodeLost):
            return recorded.event.at
    return None


async def test_a_lease_outlives_an_outage_longer_than_its_ttl_and_a_dead_agent_is_lost() -> None:
    async with replicated() as (ha, running):
        await running.add_plane()
        kept = await running.add_agent(ttl_s=TTL_S, heartbeat_s=HEARTBEAT_S)
        kept_job, kept_learner = await start_on(running, kept)
        gone = await running.add_agent(ttl_s=TTL_S, heartbeat_s=HEARTBEAT_S)
        gone_job, _ = await start_on(running, gone)
        assert kept.process is not None

        old = await ha.primary()
        [standby] = [m for m in ha.members if m is not old]
        await ha.set_paused(True)
        await gone.kill()  # for good: its node must be declared LOST
        os.kill(kept.process.pid, signal.SIGSTOP)
        try:
            await ha.kill_primary_postgres()
            await asyncio.sleep(OUTAGE_S)
            await ha.fail_over_to(standby)
            await ha.set_paused(False)
            took_over: datetime = await until(lambda: running.pool.fetchval(MANAGER_ACTIVE))
            await asyncio.sleep(SWEEPS_S)
            # By the old primary's timestamps, the kept agent's lease had ended before the
            # manager took over on the new one, and it has swept since without a heartbeat.
            lease_until: datetime = await running.pool.fetchval(
                "SELECT lease_until FROM nodes WHERE name = $1", kept.name
            )
            assert lease_until < took_over, (lease_until, took_over)
        finally:
            os.kill(kept.process.pid, signal.SIGCONT)

        # The dead agent's node is declared LOST a TTL after the manager took over, not before;
        # its job goes back to the queue.
        gone_lost: datetime = await until(lambda: lost_at(running, gone.name))
        waited = gone_lost - took_over
        assert timedelta(seconds=TTL_S - 1) <= waited <= timedelta(seconds=TTL_S + 10), waited
        await running.until_job(gone_job, lambda job: job.attempt >= 2)

        # The kept agent heartbeat again in time: its node was never LOST, its learner ran on.
        await until(lambda: renewed(running.pool, kept.name))
        assert await lost_at(running, kept.name) is None
        job: Job = await running.job(kept_job)
        assert (job.state, job.attempt) == (JobStatus.PROCESSING, 1)
        assert [f.handle for f in running.learners(kept_job)] == [kept_learner]
        assert (
            await running.pool.fetchval("SELECT state FROM nodes WHERE name = $1", kept.name)
            == "READY"
        )
