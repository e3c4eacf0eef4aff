"""`trainyard bench scale`'s connection figures with pgBouncer (docs/operations.md, "Connection
budget"), in a database of their own, in one run:

- fleet: AGENTS real agents (`run_agent`, each its own login, fake GPUs, process runtime,
  the default heartbeat and poll interval), idle, for SAMPLE_S each way: directly (pool and
  LISTEN, as today), through pgBouncer with their LISTEN connections direct, and through
  pgBouncer polling (no LISTEN). For each: the most server connections their logins held at
  once (`pg_stat_activity`), the transactions a second each agent costs the server and the
  sessions the server started a second meanwhile (`pg_stat_database`; pgBouncer opens one
  whenever a login's pool has none idle and another login's idle one had to make room);
- claim wake: one real agent, woken by LISTEN against polling through pgBouncer: from a job's
  submission to its claim (its QUEUED and DEPLOYING events' times), CLAIMS jobs one after the
  other, with the control plane's projections running in process. A submission falls anywhere
  in the polling agent's interval: its wait is up to `poll_s`, half of it on average.

Ratios: the pooled fleet's server connections to the direct fleet's, and the polling agent's
claim latency to the listening one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from bench.fleet import NODE_GPUS
from controlplane.composition import projection_runner
from controlplane.database import connect, create_pool, with_database
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.images import DEFAULT_IMAGES
from controlplane.jobs.lifecycle import JobStatus
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.service import Jobs
from controlplane.migrate import migrate
from controlplane.tenants.service import create_tenant
from harness.agent_login import agent_login_name, agent_login_url
from harness.pgbouncer import PgBouncer, missing, pgbouncer, server_connections
from harness.served import until_registered
from node_agent.agent import AgentConfig
from node_agent.service import run_agent

AGENTS = 20
BUDGET = 5
"""pgBouncer's `max_db_connections`: the server connections all the agents' logins share."""
SAMPLE_S = 15.0
"""Long enough that the server's statistics, which a backend flushes within ten seconds of
going idle, count every transaction at the same lag at both ends."""
PROBE_S = 0.05
CLAIMS = 12
TENANT = "pooler"
USER = Metadata(actor=f"tenant:{TENANT}", tenant=TENANT)
TERMINAL = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
CLAIM_WAIT_S = 60.0
"""A bound on how long one claim may take on a loaded machine, never an expectation."""

Say = Callable[[str], None]


async def measure(server_url: str, prefix: str, say: Say) -> dict[str, Any]:
    """The figures above, in database PREFIX_pooler (dropped afterwards); `unavailable`
    instead when pgBouncer is not installed."""
    problem = missing()
    if problem is not None:
        return {"unavailable": problem}
    name = f"{prefix}_pooler"
    admin = await connect(server_url, role=None)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
        url = with_database(server_url, name)
        await migrate(url)
        with tempfile.TemporaryDirectory(prefix="trainyard-bench-pooler-") as work:
            # Learners run as users of their own: they must pass through to their folders.
            os.chmod(work, 0o711)
            async with pgbouncer(server_url, pool_size=BUDGET) as bouncer:
                figures = await _measure(url, bouncer, admin, Path(work), say)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return figures


async def _measure(
    url: str, bouncer: PgBouncer, watcher: asyncpg.Connection, work: Path, say: Say
) -> dict[str, Any]:
    say(f"  pooler: {AGENTS} agents directly ...")
    direct = await _fleet(url, bouncer, watcher, work, pooled=False, listen=True)
    say(f"  pooler: {AGENTS} agents through pgBouncer, LISTEN direct ...")
    pooled_listen = await _fleet(url, bouncer, watcher, work, pooled=True, listen=True)
    say(f"  pooler: {AGENTS} agents through pgBouncer, polling ...")
    pooled_poll = await _fleet(url, bouncer, watcher, work, pooled=True, listen=False)
    say(f"  pooler: claim wake, LISTEN against polling, {CLAIMS} claims each ...")
    listening, polling = await _claim_wakes(url, bouncer, work)
    return {
        "agents": AGENTS,
        "pgbouncer_max_db_connections": BUDGET,
        "poll_s": _config(work, "claims").poll_s,
        "direct": direct,
        "pooled_listen": pooled_listen,
        "pooled_poll": pooled_poll,
        "server_connections_ratio": round(
            pooled_poll["server_connections"] / direct["server_connections"], 3
        ),
        "claim_wake_listen": listening,
        "claim_wake_poll": polling,
        "claim_wake_p50_ratio": round(polling["p50_ms"] / max(listening["p50_ms"], 0.001), 1),
    }


async def _fleet(
    url: str,
    bouncer: PgBouncer,
    watcher: asyncpg.Connection,
    work: Path,
    *,
    pooled: bool,
    listen: bool,
) -> dict[str, float]:
    names = [f"pooler-{'p' if pooled else 'd'}{'l' if listen else 'n'}-{i}" for i in range(AGENTS)]
    logins = [agent_login_name(name) for name in names]
    database = urlsplit(url).path.lstrip("/")
    async with contextlib.AsyncExitStack() as fleet:
        for name in names:
            config = dataclasses.replace(_config(work, name), listen=listen)
            await fleet.enter_async_context(_agent(url, bouncer if pooled else None, config))
        before = await _counters(watcher, database)
        started = time.perf_counter()
        held: list[int] = []
        while time.perf_counter() - started < SAMPLE_S:
            held.append(await server_connections(watcher, logins))
            await asyncio.sleep(PROBE_S)
        after = await _counters(watcher, database)
        elapsed = time.perf_counter() - started
    return {
        "server_connections": max(held),
        "server_connections_p50": statistics.median(held),
        "per_agent": round(max(held) / AGENTS, 2),
        "transactions_per_s_per_agent": round(
            (after["xact_commit"] - before["xact_commit"]) / elapsed / AGENTS, 2
        ),
        "server_sessions_started_per_s": round(
            (after["sessions"] - before["sessions"]) / elapsed, 1
        ),
    }


async def _counters(watcher: asyncpg.Connection, database: str) -> dict[str, int]:
    # A fresh snapshot each time: within a transaction the statistics would stay as first read.
    await watcher.execute("SELECT pg_stat_clear_snapshot()")
    row = await watcher.fetchrow(
        "SELECT xact_commit, sessions FROM pg_stat_database WHERE datname = $1", database
    )
    if row is None:
        raise RuntimeError(f"no statistics for database {database}")
    return {"xact_commit": row["xact_commit"], "sessions": row["sessions"]}


async def _claim_wakes(
    url: str, bouncer: PgBouncer, work: Path
) -> tuple[dict[str, float], dict[str, float]]:
    pool = await create_pool(url, min_size=2, max_size=4)
    store = EventStore(pool, EVENT_REGISTRY)
    listener = LogListener(url)
    runner = projection_runner(pool, store, listener)
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(listener.run(), name="bench-listener")
            group.create_task(runner.run(), name="bench-projections")
            await create_tenant(store, runner, TENANT, actor="bench")
            jobs = Jobs(store)
            async with _agent(url, None, _config(work, "claims-listen")):
                listening = await _claims(jobs)
            polls = dataclasses.replace(_config(work, "claims-poll"), listen=False)
            async with _agent(url, bouncer, polls):
                polling = await _claims(jobs)
            runner.stop()
            listener.stop()
            listener.wake()
    finally:
        await store.close()
        await pool.close()
    return listening, polling


async def _claims(jobs: Jobs) -> dict[str, float]:
    """CLAIMS jobs submitted one at a time, each once the last has ended: the agent is idle
    with its GPUs free at each submission, as the fleet's are, and no job is left running when
    it stops (which would send it back to the queue)."""
    manifest = JobManifest.model_validate(
        {"name": "wake", "image": DEFAULT_IMAGES, "command": ["true"], "gpus_per_learner": 1}
    )
    waits: list[float] = []
    for _ in range(CLAIMS):
        job, _ = await jobs.submit(TENANT, manifest, USER)
        ended = await _until(jobs, job.job_id, lambda state: state in TERMINAL)
        queued, deploying = ended.transitions[0], ended.transitions[1]
        waits.append((deploying.at - queued.at).total_seconds())
    return {
        "p50_ms": round(statistics.median(waits) * 1000, 1),
        "max_ms": round(max(waits) * 1000, 1),
    }


async def _until(jobs: Jobs, job_id: Any, check: Callable[[JobStatus], bool]) -> Any:
    async with asyncio.timeout(CLAIM_WAIT_S):
        while True:
            job = await jobs.load(job_id)
            if job is not None and check(job.state):
                return job
            await asyncio.sleep(PROBE_S)


def _config(work: Path, name: str) -> AgentConfig:
    return AgentConfig(
        name=name,
        work_dir=work / name,
        cpus=64,
        memory_mb=1 << 20,
        launcher=(sys.executable, "-m", "runners.launch"),
    )


@asynccontextmanager
async def _agent(url: str, bouncer: PgBouncer | None, config: AgentConfig) -> AsyncIterator[None]:
    """A real agent as `config` says, of its own login; its queries through `bouncer` if
    given, until the block ends."""
    login = await agent_login_url(url, config.name)
    stop, registered = asyncio.Event(), asyncio.Event()
    pooled_url = bouncer.url(login) if bouncer is not None else None
    task = asyncio.create_task(
        run_agent(
            login,
            config,
            fake_gpus=NODE_GPUS,
            stop=stop,
            registered=registered,
            pooled_url=pooled_url,
        )
    )
    try:
        await until_registered(task, registered)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
