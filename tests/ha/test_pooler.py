"""Agents through a real pgBouncer (Debian's 1.18, transaction mode; `harness.pgbouncer`) in
front of the test server, as docs/operations.md ("Connection budget") sets a fleet up: a real
agent that polls claims and completes a job through it, each login is still confined to its own
node's work there, and twenty agents hold no more server connections than pgBouncer's budget.
Needs the Debian package pgbouncer (`./dev test` installs it as root); skipped without it,
except under CI."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest

from controlplane.clock import SYSTEM_CLOCK
from controlplane.database import LoginUnprepared, connect, create_pooled_pool
from controlplane.jobs.lifecycle import Cancel, JobStatus
from controlplane.jobs.manifest import JobManifest
from controlplane.queries import Q
from harness.agent_login import agent_login_name, agent_login_url
from harness.pgbouncer import PgBouncer, missing, pgbouncer, server_connections
from harness.served import until_registered
from node_agent.agent import AgentConfig
from node_agent.service import run_agent
from tests.cluster import USER, Plane, agent_config

pytestmark = [pytest.mark.postgres, pytest.mark.processes]

SECRET = {"HF_TOKEN": "pooled-secret"}
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
FLEET = 20
BUDGET = 4
"""pgBouncer's server connections to the test's database, for every login together."""
SAMPLE_S = 6.0
"""Three heartbeats and six polls of every agent."""


@pytest.fixture(autouse=True)
def _needs_pgbouncer() -> None:
    problem = missing()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the pooler tests: {problem}")
        pytest.skip(problem)


@pytest.fixture
async def bouncer(pg_server: str) -> AsyncIterator[PgBouncer]:
    async with pgbouncer(pg_server, pool_size=BUDGET) as running:
        yield running


@asynccontextmanager
async def pooled_agent(
    db_url: str, bouncer: PgBouncer, config: AgentConfig, *, fake_gpus: int = 1
) -> AsyncIterator[None]:
    """A real agent of its own login, whose queries go through `bouncer` and which polls
    (no LISTEN connection), until the block ends."""
    login = await agent_login_url(db_url, config.name)
    stop, registered = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        run_agent(
            login,
            dataclasses.replace(config, listen=False),
            fake_gpus=fake_gpus,
            stop=stop,
            registered=registered,
            pooled_url=bouncer.url(login),
        )
    )
    try:
        await until_registered(task, registered)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def test_an_agent_through_pgbouncer_claims_and_completes_a_job_and_stays_confined(
    plane: Plane, db_url: str, bouncer: PgBouncer, owner: asyncpg.Connection, tmp_path: Path
) -> None:
    config = agent_config(tmp_path, name="pooled-1")
    async with pooled_agent(db_url, bouncer, config):
        printed = await plane.submit([sys.executable, "-c", "print('through the pooler')"])
        job = await plane.state(printed, JobStatus.COMPLETED, JobStatus.FAILED)
        assert job.state is JobStatus.COMPLETED and job.exit_codes == [0], job
        assert job.nodes == ["pooled-1"]
        assert "through the pooler" in await plane.log_text(printed)

        # A job of its node, with a secret: its login reads it through pgBouncer, another
        # node's login (through the same pgBouncer, whose budget the two share) does not.
        manifest = JobManifest.model_validate(
            {"name": "t", "image": "img", "gpus_per_learner": 1, "command": SLEEP}
        )
        sleeper, _ = await plane.jobs.submit("acme", manifest, USER, secret_env=SECRET)
        await plane.state(sleeper.job_id, JobStatus.PROCESSING)
        own = await create_pooled_pool(
            bouncer.url(await agent_login_url(db_url, "pooled-1")), min_size=1, max_size=1
        )
        other = await create_pooled_pool(
            bouncer.url(await agent_login_url(db_url, "pooled-2")), min_size=1, max_size=1
        )
        try:
            for _ in range(3):  # alternating, so that pgBouncer hands server connections over
                assert await own.fetchval(Q["job_secret_env"], sleeper.job_id) is not None
                assert await other.fetchval(Q["job_secret_env"], sleeper.job_id) is None
                assert await other.fetchval("SELECT session_user") == agent_login_name("pooled-2")
                assert await other.fetchval("SELECT current_user") == "trainyard_agent"
        finally:
            await own.close()
            await other.close()
        await plane.jobs.execute(sleeper.job_id, Cancel(reason="done", at=SYSTEM_CLOCK.now()), USER)
        await plane.state(sleeper.job_id, JobStatus.CANCELLED)


async def test_a_login_without_its_settings_is_refused_through_pgbouncer(
    db_url: str, bouncer: PgBouncer, owner: asyncpg.Connection
) -> None:
    login = await agent_login_url(db_url, "unprepared")
    # As a login made before `agent-login create` gave logins their settings.
    await owner.execute(f'ALTER ROLE "{agent_login_name("unprepared")}" RESET ALL')
    with pytest.raises(LoginUnprepared, match="agent-login bind"):
        await create_pooled_pool(bouncer.url(login), min_size=1, max_size=1)


async def test_twenty_polling_agents_hold_at_most_pgbouncers_budget(
    plane: Plane, db_url: str, bouncer: PgBouncer, tmp_path: Path
) -> None:
    names = [f"fleet-{i}" for i in range(FLEET)]
    logins = [agent_login_name(name) for name in names]
    watcher = await connect(db_url, role=None)
    try:
        async with contextlib.AsyncExitStack() as fleet:
            for name in names:
                config = dataclasses.replace(
                    agent_config(tmp_path / name, name=name), heartbeat_s=2.0, poll_s=1.0
                )
                await fleet.enter_async_context(pooled_agent(db_url, bouncer, config))
            before = dict(await watcher.fetch("SELECT name, heartbeat_at FROM nodes"))
            held: list[int] = []
            until = time.monotonic() + SAMPLE_S
            while time.monotonic() < until:
                held.append(await server_connections(watcher, logins))
                await asyncio.sleep(0.05)
            # Every agent heartbeat meanwhile: the budget held their connections back, not them.
            after = dict(await watcher.fetch("SELECT name, heartbeat_at FROM nodes"))
            assert sorted(after) == sorted(names)
            assert all(after[name] > before[name] for name in names), (before, after)
            # And one of them claims a job when its poll comes round.
            job_id = await plane.submit([sys.executable, "-c", "print('fleet')"])
            job = await plane.state(job_id, JobStatus.COMPLETED, JobStatus.FAILED)
            assert job.state is JobStatus.COMPLETED, job
    finally:
        await watcher.close()
    # pgBouncer holds its budget, whatever the number of agents (directly, twenty would hold
    # sixty). A backend it has just closed, to open one for another login (each login has a
    # pool of its own), is listed until it has exited: a moment's more, never one per agent.
    assert 0 < statistics.median(held) <= BUDGET, held
    assert max(held) <= 2 * BUDGET, held
