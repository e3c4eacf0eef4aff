"""`trainyard bench scale`: how each hot path's cost grows with the fleet, the queue and the
history, against a real `trainyard serve` process.

For each size of history (`bench.scale_fill`: 10 k, 1 M and 10 M events of finished jobs of
eight tenants, in databases kept between runs), with NODES simulated agents (`bench.fleet`:
8 fake GPUs each, heartbeating all along) and the queue topped up to QUEUED jobs:
- claim: the agents come up over WARMUP_S and fill their nodes; once the projections have
  caught up, the claims that follow learners' ends (RUN_S) are timed for `seconds` (p50,
  p99, empty ones included), and so is the projections' lag meanwhile: from a log tail seen
  to the `jobs` projection's checkpoint passing it (p99);
- submit: POST /v1/jobs at SUBMIT_RATE per second (p99, from the scheduled instant);
- status: GET /v1/jobs/{id} of jobs drawn from the whole history (p99);
- list: GET /v1/jobs as a tenant, with each filter of LIST_FILTERS in turn (p99);
- sse: `subscribers` SSE streams, SSE_PER_JOB on each job, while events are appended
  (`bench.api`);
- restart: the control plane killed (-9) and started again: until /readyz says ready;
- reconcile: a restarted agent of a node holding NODE_GPUS live learners (`Agent.reconcile`);
- rebuild: every projection's replay of the whole log, recorded by the fill;
- size: the database's size per million events;
- connections: the server connections one real agent holds (`pg_stat_activity`, sampled over
  CONNECTIONS_S of heartbeats and claim rounds), the most its code may open
  (`node_agent.service`), and what `nodes` such agents need of the server's max_connections
  (the simulated fleet itself shares one pool, so it is counted per real agent);
- pooler: real agents directly against through pgBouncer, listening or polling: their server
  connections, their transactions a second, and the claim wake latency polling costs
  (`bench.scale_pooler`); left out with `pooler=False` (`--no-pooler`).

`growth` is the worst ratio of a hot path's p99 at the largest size to its p99 at the smallest.
Plots of every figure against the history's size go to `out` as PNG.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

import aiohttp
import asyncpg

from bench.api import AGENT, UNLIMITED, sse, submits
from bench.fleet import NODE_GPUS, Fleet, agent_id
from bench.scale_fill import (
    MANIFESTS,
    PREFIX,
    SIZES,
    TEAMS,
    TENANTS,
    Filled,
    filled,
    finished_job_id,
)
from bench.scale_pooler import measure as measure_pooler
from controlplane.agent_port.postgres import PostgresPort
from controlplane.agents.claims import Releases, claim
from controlplane.agents.nodes import Nodes
from controlplane.clock import SYSTEM_CLOCK
from controlplane.database import AGENT_ROLE, connect, create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.records import LogPosition, StreamAppend
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.lifecycle import Cancel, Submit, decide
from controlplane.jobs.projection import CLAIMABLE_CHANNEL, JobsProjection
from controlplane.jobs.service import Jobs
from controlplane.jobs.streams import job_stream
from controlplane.queries import Q
from controlplane.scheduling.claim import Claim
from harness.agent_login import agent_login_name, agent_login_url
from harness.served import ServedControlPlane, until_registered
from node_agent.agent import Agent, AgentConfig
from node_agent.inventory import open_inventory
from node_agent.log_shipper import LogShipper
from node_agent.log_sink import NumberedSink
from node_agent.runtimes import open_runtime
from node_agent.service import AGENT_CONNECTIONS, run_agent

NODES = 1000
QUEUED = 10_000
RUN_S = (30.0, 330.0)
"""How long a simulated learner runs, drawn: three minutes on average (real training runs for
hours), so that once the nodes have filled some 15 learners end, and as many claims follow,
a second: what this benchmark's own 2-core machine sustains beside everything else, so that
it measures the history's cost, not a saturated machine's queues."""
SUBMIT_RATE = 50.0
STATUS_READS = 500
LIST_READS = 50
"""Of each filter."""
LIST_FILTERS: tuple[dict[str, str], ...] = (
    {},
    {"state": "COMPLETED"},
    {"label": "team=vision"},
    {"state": "QUEUED", "label": "team=nlp"},
)
SSE_PER_JOB = 10
"""Subscribers of each job the SSE part appends to."""
SSE_RATE = 50.0
LAG_PROBE_S = 0.25
LAG_CHECK_S = 0.02
PROJECTED_S = 120.0
WARMUP_S = 15.0
"""The agents come up over this long and fill their nodes; claims are timed after it."""
POOL = 16
BEATS_POOL = 4
CONNECTIONS_S = 6.0
"""How long one agent's connections are sampled: three heartbeats and its claim rounds."""
CONNECTIONS_PROBE_S = 0.05
HOT_PATHS = ("claim", "submit", "status", "list", "sse")
TARGETS = {
    "claim_p99_ms": 50,
    "submit_p99_ms": 50,
    "status_p99_ms": 20,
    "list_p99_ms": 50,
    "sse_p99_ms": 250,
    "restart_ready_s": 5,
    "growth": 1.5,
}

Say = Callable[[str], None]


async def run(
    url: str,
    *,
    sizes: Sequence[str] = tuple(SIZES),
    nodes: int = NODES,
    queued: int = QUEUED,
    seconds: float = 20.0,
    subscribers: int = 5000,
    out: Path,
    homes: Path,
    prefix: str = PREFIX,
    pooler: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr)

    by_size: dict[str, dict[str, float]] = {}
    connections: dict[str, float] = {}
    fleet: dict[str, Any] = {"skipped": "--no-pooler"}
    for label in sizes:
        history = await filled(url, label, say, prefix)
        if not connections:
            say(f"scale {label}: one agent's connections ...")
            connections = await _connections(history.url, nodes)
            if pooler:
                say("scale: connections through pgBouncer ...")
                fleet = await measure_pooler(url, prefix, say)
        say(f"scale {label}: {history.events:,} events; measuring ...")
        # The control plane's home is kept with its database: the admin token it issues on
        # its first start there is read from it by every later run.
        home = homes / history.name
        await asyncio.to_thread(home.mkdir, parents=True, exist_ok=True)
        by_size[label] = await _measure(history, home, nodes, queued, seconds, subscribers, say)
    largest = by_size[sizes[-1]]
    smallest = by_size[sizes[0]]
    growth = max(largest[f"{path}_p99_ms"] / smallest[f"{path}_p99_ms"] for path in HOT_PATHS)
    return {
        "nodes": nodes,
        "queued_jobs": queued,
        "events": int(largest["events"]),
        **{key: largest[key] for key in TARGETS if key in largest},
        "growth": round(growth, 2),
        "connections": connections,
        "pooler": fleet,
        "targets": TARGETS,
        "by_events": by_size,
        "plots": [str(path) for path in _plot(by_size, out)],
    }


async def _measure(
    history: Filled,
    home: Path,
    nodes: int,
    queued: int,
    seconds: float,
    subscribers: int,
    say: Say,
) -> dict[str, float]:
    env = {
        "TRAINYARD_MAX_STREAMS": str(subscribers + 100),
        # The history is kept between runs whole: its year of logs stays (the worst case for
        # the database's size), rather than going a batch each sweep during the runs.
        "TRAINYARD_LOG_RETENTION_DAYS": "0",
    }
    plane = ServedControlPlane(history.url, home, env=env)
    pool = await create_pool(history.url, min_size=POOL, max_size=POOL)
    beats = await create_pool(history.url, min_size=BEATS_POOL, max_size=BEATS_POOL)
    store = EventStore(pool, EVENT_REGISTRY)
    fleet = Fleet(pool, beats, store, nodes, RUN_S)
    try:
        figures: dict[str, float] = {
            # The history as this run finds it: the fill's, and what earlier runs appended.
            "events": await pool.fetchval("SELECT max(position) FROM events"),
            "fill_s": round(history.fill_s, 1),
        }
        await plane.start()
        connector = aiohttp.TCPConnector(limit=0)
        admin = {"Authorization": f"Bearer {_admin_token(plane, history)}"}
        async with aiohttp.ClientSession(plane.url, headers=admin, connector=connector) as session:
            tokens = await _tenants(session)
            await _queue_up(pool, store, queued)
            say(f"  {nodes} nodes register ...")
            await fleet.register()
            async with fleet.heartbeating():
                say(f"  agents come up over {WARMUP_S:g}s, then claims for {seconds:g}s ...")
                listener = LogListener(history.url, channel=CLAIMABLE_CHANNEL, role=AGENT_ROLE)
                async with _listening(listener):
                    lag_s = await _steadily(fleet, listener, store, pool, seconds)
                figures |= _percentiles("claim", fleet.claim_s)
                figures["claims"] = fleet.claimed
                figures["projection_lag_p99_ms"] = _ms(_p99(lag_s))
                say("  submits, statuses and lists ...")
                submitted = await submits(session, SUBMIT_RATE, seconds, TENANTS[0])
                figures["submit_p99_ms"] = submitted["submit_p99_ms"]
                figures |= _percentiles("status", await _statuses(history, session))
                figures |= _percentiles("list", await _lists(plane.url, tokens))
                say(f"  {subscribers} SSE subscribers ...")
                watched = max(1, subscribers // SSE_PER_JOB)
                delivered = await sse(
                    history.url, session, subscribers, watched, SSE_RATE, seconds / 2, TENANTS[1]
                )
                figures["sse_p99_ms"] = delivered["sse_delivery_p99_ms"]
                figures["sse_missing"] = delivered["sse_deliveries_missing"]
            figures["heartbeats_per_s"] = round(fleet.heartbeats_per_s, 1)
            await fleet.deregister()
        say("  an agent's reconcile ...")
        figures["reconcile_s"] = await _reconcile(history.url, store)
        say("  restart ...")
        await plane.kill()
        await plane.start()
        figures["restart_ready_s"] = round(time.perf_counter() - plane.spawned_at, 2)
    finally:
        await plane.stop()
        await store.close()
        await pool.close()
        await beats.close()
    if history.rebuild_s is not None:  # a fill that was interrupted timed no whole replay
        figures["rebuild_s"] = round(history.rebuild_s, 1)
    owner = await connect(history.url, role=None)
    try:
        size = await owner.fetchval("SELECT pg_database_size(current_database())")
        events = await owner.fetchval("SELECT max(position) FROM events")
    finally:
        await owner.close()
    figures["mb_per_million_events"] = round(size / 2**20 / (events / 1e6), 1)
    return figures


def _admin_token(plane: ServedControlPlane, history: Filled) -> str:
    try:
        return plane.admin_token
    except FileNotFoundError:
        raise RuntimeError(
            f"database {history.name} has an admin token, but {plane.home} does not hold it "
            "(it was issued from another home): drop the database to have it filled anew"
        ) from None


async def _reconcile(url: str, store: EventStore) -> float:
    """A real agent (process runtime, fake GPUs) restarting on a node whose earlier agent left
    NODE_GPUS jobs running there: how long its `reconcile()` takes. The jobs are cancelled
    afterwards, so that the next run finds the node empty."""
    name = "reconcile-0"
    with tempfile.TemporaryDirectory() as work:
        config = AgentConfig(
            name=name,
            work_dir=Path(work),
            cpus=64,
            memory_mb=1 << 20,
            launcher=(sys.executable, "-m", "runners.launch"),
        )
        pool = await create_pool(url, min_size=2, max_size=4, role=AGENT_ROLE)
        inventory = open_inventory(NODE_GPUS, name, logging.getLogger(__name__))
        try:
            async with open_runtime(
                "process", work_dir=config.work_dir, request_gpus=False, images=config.images
            ) as runtime:
                port = PostgresPort(pool)
                logs = NumberedSink(LogShipper(port))
                agent = Agent(
                    config, port, LogListener(url), inventory, runtime, logs, agent_id(name)
                )
                await agent.register()
                won: list[Claim] = []
                while taken := await claim(pool, store, name):
                    won += taken
                started = time.perf_counter()
                await agent.reconcile()
                reconcile_s = time.perf_counter() - started
                jobs, releases = Jobs(store), Releases(pool, name)
                for job in won:
                    await jobs.execute(job.job.job_id, Cancel("bench", SYSTEM_CLOCK.now()), AGENT)
                    await releases.release(job.job.job_id, job.attempt)
                await Nodes(pool, store).deregister(name, agent_id(name))
        finally:
            inventory.close()
            await pool.close()
    return round(reconcile_s, 3)


async def _connections(url: str, nodes: int) -> dict[str, float]:
    """A real agent (`run_agent`, as `trainyard agent` runs it: its own login, fake GPUs,
    the process runtime) registered and at work on an otherwise idle database: the most
    server connections its login held at once over CONNECTIONS_S, against the most its code
    may open, and both for `nodes` agents."""
    name = "connections-0"
    login = await agent_login_url(url, name)
    owner = await connect(url, role=None)
    stop, registered = asyncio.Event(), asyncio.Event()
    with tempfile.TemporaryDirectory() as work:
        config = AgentConfig(
            name=name,
            work_dir=Path(work),
            cpus=64,
            memory_mb=1 << 20,
            launcher=(sys.executable, "-m", "runners.launch"),
        )
        agent = asyncio.create_task(
            run_agent(login, config, fake_gpus=NODE_GPUS, stop=stop, registered=registered)
        )
        try:
            await until_registered(agent, registered)
            held = 0
            until = time.perf_counter() + CONNECTIONS_S
            while time.perf_counter() < until:
                count = await owner.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE usename = $1",
                    agent_login_name(name),
                )
                held = max(held, count)
                await asyncio.sleep(CONNECTIONS_PROBE_S)
            max_connections = int(await owner.fetchval("SHOW max_connections"))
        finally:
            stop.set()
            await asyncio.wait_for(agent, 30)
            await owner.close()
    return {
        "per_agent_held": held,
        "per_agent_bound": AGENT_CONNECTIONS,
        "fleet_nodes": nodes,
        "fleet_held": held * nodes,
        "fleet_bound": AGENT_CONNECTIONS * nodes,
        "server_max_connections": max_connections,
    }


async def _tenants(session: aiohttp.ClientSession) -> dict[str, str]:
    """Each tenant's limits lifted (the benchmark measures the paths, not the limits that
    protect them) and a token of its own for this run."""
    tokens = {}
    for tenant in TENANTS:
        async with session.put(f"/v1/tenants/{tenant}/limits", json=UNLIMITED) as response:
            response.raise_for_status()
        async with session.post(f"/v1/tenants/{tenant}/tokens") as response:
            response.raise_for_status()
            tokens[tenant] = (await response.json())["token"]
    return tokens


QUEUED_NOW = "SELECT count(*) FROM job_status WHERE state = 'QUEUED'"


async def _queue_up(pool: asyncpg.Pool, store: EventStore, queued: int) -> None:
    """Submit jobs (the store's batch append, not the timed API) until `queued` wait; once the
    `jobs` projection holds them all, return."""
    waiting = await pool.fetchval(QUEUED_NOW)
    draw = random.Random()
    for first in range(waiting, queued, 500):
        appends = []
        for _ in range(first, min(first + 500, queued)):
            job_id, tenant = uuid4(), draw.choice(TENANTS)
            manifest = MANIFESTS[draw.choice(TEAMS), draw.choice((1, 1, 1, 2, 4))]
            events = decide(Submit(job_id, tenant, manifest, SYSTEM_CLOCK.now()), None)
            metadata = Metadata(actor="bench", tenant=tenant)
            appends.append(StreamAppend(job_stream(job_id), 0, events, metadata))
        async with pool.acquire() as conn, conn.transaction():
            await store.append_many(appends, conn=conn)
    async with asyncio.timeout(120):
        while True:
            if await pool.fetchval(QUEUED_NOW) >= queued:
                return
            await asyncio.sleep(0.2)


async def _steadily(
    fleet: Fleet, listener: LogListener, store: EventStore, pool: asyncpg.Pool, seconds: float
) -> list[float]:
    """The fleet at work: once its nodes have filled (WARMUP_S) and the projections have
    caught up, its claims are timed for `seconds`, while every LAG_PROBE_S the log's tail is
    noted with how long the `jobs` projection took to pass it. Returns those lags; the
    projections have applied the whole run when it returns."""
    over = asyncio.Event()
    lags: list[float] = []
    waiting: list[tuple[LogPosition, float]] = []

    async def probe() -> None:
        while True:
            waiting.append((await store.log_tail(), time.perf_counter()))
            await asyncio.sleep(LAG_PROBE_S)

    async def check() -> None:
        while True:
            applied = await _checkpoint(pool)
            now = time.perf_counter()
            lags.extend(now - seen for tail, seen in waiting if tail <= applied)
            waiting[:] = [(tail, seen) for tail, seen in waiting if tail > applied]
            await asyncio.sleep(LAG_CHECK_S)

    async with asyncio.TaskGroup() as group:
        group.create_task(fleet.work(listener, WARMUP_S, over))
        await asyncio.sleep(WARMUP_S)
        await _projected(pool, await store.log_tail())
        fleet.timing = True
        probes = [group.create_task(probe()), group.create_task(check())]
        await asyncio.sleep(seconds)
        fleet.timing = False
        for task in probes:
            task.cancel()
        over.set()
    await _projected(pool, await store.log_tail())
    return lags


async def _checkpoint(pool: asyncpg.Pool) -> LogPosition:
    row = await pool.fetchrow(Q["read_checkpoints"], [JobsProjection.name])
    if row is None:
        raise RuntimeError("the jobs projection has no checkpoint")
    return LogPosition(row["xid"], row["position"])


async def _projected(pool: asyncpg.Pool, tail: LogPosition) -> None:
    """Once the `jobs` projection has applied the log through `tail`."""
    async with asyncio.timeout(PROJECTED_S):
        while True:
            if await _checkpoint(pool) >= tail:
                return
            await asyncio.sleep(LAG_CHECK_S)


@asynccontextmanager
async def _listening(listener: LogListener) -> AsyncIterator[None]:
    task = asyncio.create_task(listener.run())
    try:
        await listener.connected.wait()
        yield
    finally:
        listener.stop()
        listener.wake()
        await task


async def _statuses(history: Filled, session: aiohttp.ClientSession) -> list[float]:
    """GET /v1/jobs/{id} of jobs drawn from the whole history, one after another."""
    draw = random.Random(0)
    ids = [
        finished_job_id(history.label, draw.randrange(history.finished_jobs))
        for _ in range(STATUS_READS)
    ]
    return [await _timed(session, f"/v1/jobs/{job_id}") for job_id in ids]


async def _lists(url: str, tokens: dict[str, str]) -> list[float]:
    """A tenant's GET /v1/jobs with each filter, LIST_READS times, tenants in turn."""
    latencies = []
    for i in range(LIST_READS):
        tenant = TENANTS[i % len(TENANTS)]
        headers = {"Authorization": f"Bearer {tokens[tenant]}"}
        async with aiohttp.ClientSession(url, headers=headers) as session:
            for params in LIST_FILTERS:
                latencies.append(await _timed(session, "/v1/jobs", {**params, "limit": "50"}))
    return latencies


async def _timed(
    session: aiohttp.ClientSession, path: str, params: dict[str, str] | None = None
) -> float:
    started = time.perf_counter()
    async with session.get(path, params=params) as response:
        response.raise_for_status()
        await response.read()
    return time.perf_counter() - started


def _percentiles(name: str, seconds: list[float]) -> dict[str, float]:
    if not seconds:
        raise RuntimeError(f"no {name} was timed: give the run more --seconds")
    return {
        f"{name}_p50_ms": _ms(statistics.median(seconds)),
        f"{name}_p99_ms": _ms(_p99(seconds)),
    }


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _plot(by_size: dict[str, dict[str, float]], out: Path) -> list[Path]:
    """One PNG per figure against the history's size, and one of the hot paths' p99s."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    out.mkdir(parents=True, exist_ok=True)
    from matplotlib import pyplot

    events = [figures["events"] for figures in by_size.values()]
    written: list[Path] = []
    hot = out / "scale_p99.png"
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for path in HOT_PATHS:
        axes.plot(events, [f[f"{path}_p99_ms"] for f in by_size.values()], marker="o", label=path)
    axes.set(xscale="log", yscale="log", xlabel="events in the log", ylabel="p99 (ms)")
    axes.set_title("Hot paths' p99 against history")
    axes.legend()
    figure.savefig(hot, dpi=100, bbox_inches="tight")
    pyplot.close(figure)
    written.append(hot)
    for key in (
        "restart_ready_s",
        "reconcile_s",
        "rebuild_s",
        "mb_per_million_events",
        "projection_lag_p99_ms",
    ):
        png = out / f"scale_{key}.png"
        figure, axes = pyplot.subplots(figsize=(6, 4))
        known = [(f["events"], f[key]) for f in by_size.values() if key in f]
        axes.plot(*zip(*known, strict=True), marker="o")
        axes.set(xscale="log", xlabel="events in the log", ylabel=key)
        figure.savefig(png, dpi=100, bbox_inches="tight")
        pyplot.close(figure)
        written.append(png)
    return written
