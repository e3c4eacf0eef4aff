"""`trainyard bench inference`: IDunno's experiment (two endless inference jobs sharing a
cluster in fair time; a worker, then the coordinator, killed) on Trainyard, with real
processes on a scratch database.

The cluster: a control plane process (`trainyard serve`) and two node agents (`trainyard
agent --runtime process`), sharing the model repository's folder; a tenant and its token. Two
models are published: ResNet18 and AlexNet (`runners.examples.vision`: torchvision's layer
layouts, random weights, as many torch threads as a replica has CPUs). Each job queries
batches of BATCH generated 3xSIZExSIZE images (SIZE 224 by default), endless, with 2
replicas (one per agent).

- `second_job_start_s`: the ResNet18 job runs; the AlexNet job is submitted (weight 1 each);
  from its submission (the job's `submitted_at`) to its first query starting on a replica
  (the query's `started_at`): its replicas start, load the model, and take their turn at once.
  IDunno: 2.48 s. `second_job_stages_s`: where it went, by the replica that ran that query
  (to its PROCESSING, to its model loaded, to the query's start). With `warm` (default 1)
  each agent keeps that many warm sandboxes ready with torch imported (`trainyard agent
  --warm N --warm-import torch`, `node_agent.warm`), in which a replica starts; `warm` 0:
  every replica starts cold.
- `fair_ratio_error`: |rate1 / rate2 - 1| over the WINDOW_S seconds from the second job's first
  query on, each job's rate counted from its results recorded in the window, as (n - 1) over
  the time from its first to its last there (so that where the window cuts a query off does
  not count). Target <= 0.1.
- `weighted_ratio_error`: the AlexNet job is cancelled and another submitted with weight 2; the
  same over its window, its rate halved against the ResNet18 job's. Target <= 0.1.
  (`weighted_job_start_s`: its start, as above.)
- `worker_recovery_s`: the cluster's rate (both jobs' results) over the BEFORE_S seconds before
  a kill -9 of a ResNet18 replica's process (`runners.serve`, holding a query); the time from
  the kill to the first instant t from which the next FORWARD_S seconds hold at least 90 % of
  that rate (0 when they always did). The query it held is run again elsewhere, once.
  IDunno: 3.23 s.
- `controlplane_recovery_s`: the same for a kill -9 of the control plane (down DOWN_S, then
  started again: `api_back_s` from its start to /readyz). The agents take and record queries
  without it. IDunno (coordinator failure): 18.32 s.
- `lost_queries`: once every query started before the end has had the time to finish: the
  queries started that are not recorded as succeeded, and the numbers missing from each job's
  0..started-1. `duplicate_results`: results recorded more than once for one query (its rows
  beyond the first: the table's key makes it 0, and a retried query's late answer is fenced
  off by its claim). `retried_queries`: queries run more than once (by a kill), counted once.
- `stats_exact`: each job's `GET /v1/jobs/{id}/stats` equals the figures recomputed here from
  `audit.inference_queries` (count, mean, standard deviation, percentiles), read while none of
  its queries finished (the API's counts and latency the same before and after the rows).

Everything (Postgres, the control plane, the agents, the four replicas) shares this machine's
CPUs: fair time is the share of those.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import aiohttp
import asyncpg

from bench.scratch import scratch_database
from controlplane.database import connect, create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.projections.runner import ProjectionRunner
from controlplane.settings import ARTIFACTS_DIR_ENV
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import create_tenant
from harness.agent_process import AgentProcess
from harness.processes import replica_process, started, until
from harness.served import ServedControlPlane
from runners.examples.vision import servable_source

TENANT = "bench"
NODES = ("bench-n1", "bench-n2")
BATCH = 16
REPLICAS = 2
STATS_READS = 20
"""Reads of a job's figures for one taken while none of its queries finished (`_stats_exact`)."""
WINDOW_S = 30.0
BEFORE_S = 10.0
FORWARD_S = 10.0
DOWN_S = 5.0
STEP_S = 0.05
"""The resolution of the recovery figures."""
READY_S = 180.0
FINISH_S = 120.0
PROBE_S = 0.05
IDUNNO = {
    "second_job_start_s": 2.48,
    "worker_recovery_s": 3.23,
    "controlplane_recovery_s": 18.32,
}
TARGETS = {
    "fair_ratio_error": "<= 0.1",
    "weighted_ratio_error": "<= 0.1",
    "second_job_start_s": "<= 1",
    "worker_recovery_s": "<= 2",
    "controlplane_recovery_s": "<= 2",
    "lost_queries": "0",
    "duplicate_results": "0",
}

Say = Callable[[str], None]


async def run(
    url: str,
    *,
    window_s: float = WINDOW_S,
    size: int = 224,
    warm: int = 1,
    progress: bool = False,
) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(f"inference: {what}", file=sys.stderr)

    async with scratch_database(url, "inference") as database:
        pool = await create_pool(database, min_size=1, max_size=4)
        # What an auditor reads (audit.inference_queries), which the app's role may not.
        auditor = await connect(database, role=None)
        try:
            with tempfile.TemporaryDirectory(prefix="trainyard-inference-") as home:
                root = Path(home)
                # Passable by the replicas, which run as users of their own (the agent is root).
                os.chmod(root, 0o711)
                async with _cluster(database, root, pool, auditor, warm) as cluster:
                    figures = await _measure(cluster, window_s, size, say)
        finally:
            await auditor.close()
            await pool.close()
    return {
        **figures,
        "idunno": IDUNNO,
        "targets": TARGETS,
        "settings": {
            "models": ["resnet18", "alexnet"],
            "batch_size": BATCH,
            "image": [3, size, size],
            "replicas_per_job": REPLICAS,
            "agents": len(NODES),
            "torch_threads_per_replica": "its CPUs, rounded up (runners.threads)",
            "runtime": "process",
            "warm_sandboxes_per_agent": warm,
            "window_s": window_s,
            "cpus": os.cpu_count(),
        },
    }


@dataclass
class _Cluster:
    pool: asyncpg.Pool
    auditor: asyncpg.Connection
    plane: ServedControlPlane
    agents: list[AgentProcess]
    token: str
    session: aiohttp.ClientSession

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with self.session.request(
            method, self.plane.url + path, json=body, headers=headers
        ) as response:
            if response.status >= 300:
                raise RuntimeError(f"{method} {path}: {response.status} {await response.text()}")
            return await response.json()


@asynccontextmanager
async def _cluster(
    database: str, root: Path, pool: asyncpg.Pool, auditor: asyncpg.Connection, warm: int
) -> AsyncIterator[_Cluster]:
    store = EventStore(pool, EVENT_REGISTRY)
    runner = ProjectionRunner(pool, store, LogListener(database), [TenantsProjection()])
    issued = await create_tenant(store, runner, TENANT, actor="bench")
    artifacts = root / "artifacts"
    plane = ServedControlPlane(database, root / "plane", env={ARTIFACTS_DIR_ENV: str(artifacts)})
    agents = [
        AgentProcess(
            database,
            root / name,
            name,
            ttl_s=3,
            heartbeat_s=0.5,
            artifacts_dir=artifacts,
            log=root / f"{name}.log",
            options=("--warm", str(warm), "--warm-import", "torch") if warm else (),
        )
        for name in NODES
    ]
    try:
        async with (
            started(plane, agents, pool),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        ):
            yield _Cluster(pool, auditor, plane, agents, issued.plaintext, session)
    except BaseException:
        # Where the jobs were: why it stopped (the agents' logs are printed as they stop).
        with contextlib.suppress(Exception):
            for row in await pool.fetch(
                "SELECT doc -> 'manifest' ->> 'name' AS name, state,"
                " doc ->> 'failure_reason' AS reason FROM job_status ORDER BY submitted_at"
            ):
                print(f"job {row['name']}: {row['state']} {row['reason'] or ''}", file=sys.stderr)
        raise


async def _measure(cluster: _Cluster, window_s: float, size: int, say: Say) -> dict[str, Any]:
    for arch in ("resnet18", "alexnet"):
        await _publish(cluster, arch)
    say("ResNet18 job, until its queries flow")
    resnet = await _submit(cluster, "resnet18", 1.0, size)
    await _first_finished(cluster.pool, resnet)
    await asyncio.sleep(5)
    say("AlexNet job, weight 1: second job start, fair time")
    alexnet, second_start = await _second_job(cluster, "alexnet", 1.0, size)
    fair = await _window(cluster.pool, (resnet, alexnet), second_start, window_s)
    await cluster.call("POST", f"/v1/jobs/{alexnet}/cancel")
    say("AlexNet job, weight 2: weighted fair time")
    weighted, weighted_start = await _second_job(cluster, "alexnet", 2.0, size)
    heavy = await _window(cluster.pool, (resnet, weighted), weighted_start, window_s)
    jobs = (resnet, weighted)
    say("kill -9 of a ResNet18 replica")
    worker = await _recovery(cluster, jobs, lambda: _kill_replica(cluster, resnet))
    say("kill -9 of the control plane")
    back: dict[str, float] = {}

    async def kill_plane() -> None:
        await cluster.plane.kill()
        await asyncio.sleep(DOWN_S)
        started = time.perf_counter()
        await cluster.plane.start()
        back["api_back_s"] = round(time.perf_counter() - started, 3)

    plane = await _recovery(cluster, jobs, kill_plane)
    say("settling: every query started finishes")
    end = await cluster.pool.fetchval("SELECT now()")
    integrity = await _integrity(cluster.pool, cluster.auditor, jobs, end)
    exact = {str(job): await _stats_exact(cluster, job) for job in (*jobs, alexnet)}
    for job in jobs:
        await cluster.call("POST", f"/v1/jobs/{job}/cancel")
    return {
        "second_job_start_s": _seconds(second_start["start_s"]),
        "weighted_job_start_s": _seconds(weighted_start["start_s"]),
        "second_job_stages_s": second_start["stages_s"],
        "weighted_job_stages_s": weighted_start["stages_s"],
        "fair_ratio_error": fair["ratio_error"],
        # |(rate2 / 2) / rate1 - 1|: `ratio` is rate1 / rate2 (1/2 when fair).
        "weighted_ratio_error": abs(1 / (2.0 * heavy["ratio"]) - 1),
        "worker_recovery_s": worker["recovery_s"],
        "controlplane_recovery_s": plane["recovery_s"],
        "api_back_s": back.get("api_back_s"),
        "lost_queries": integrity["lost"],
        "duplicate_results": integrity["duplicates"],
        "retried_queries": integrity["retried"],
        "stats_exact": all(exact.values()),
        "fair": fair,
        "weighted": heavy,
        "worker_failure": worker,
        "controlplane_failure": plane,
        "queries": integrity,
    }


async def _publish(cluster: _Cluster, arch: str) -> None:
    metadata = {
        "title": f"trainyard bench inference: {arch}",
        "creators": [{"name": "trainyard bench"}],
        "framework": "pytorch",
        "servable": {
            "entry_point": f"{arch}:predict",
            "input": {"type": "list"},
            "output": {"type": "list"},
        },
    }
    form = aiohttp.MultipartWriter("form-data")
    part = form.append_json({"metadata": metadata})
    part.set_content_disposition("form-data", name="publication")
    part = form.append(servable_source(arch).encode())
    part.set_content_disposition("form-data", name="artifact", filename=f"{arch}.py")
    async with cluster.session.post(
        f"{cluster.plane.url}/v1/models/{arch}/versions",
        data=form,
        headers={"Authorization": f"Bearer {cluster.token}"},
    ) as response:
        if response.status != 201:
            raise RuntimeError(f"publishing {arch}: {response.status} {await response.text()}")


async def _submit(cluster: _Cluster, arch: str, weight: float, size: int) -> UUID:
    job = await cluster.call(
        "POST",
        "/v1/inference",
        {
            "name": f"{arch}-w{weight:g}",
            "model": arch,
            "input": {"generate": {"shape": [3, size, size], "seed": 7}},
            "batch_size": BATCH,
            "weight": weight,
            "replicas": REPLICAS,
            "resources": {"cpus": 0.5},
        },
    )
    return UUID(job["id"])


async def _first_finished(pool: asyncpg.Pool, job: UUID) -> None:
    async def finished() -> bool | None:
        found = await pool.fetchval(
            "SELECT true FROM inference_queries WHERE job_id = $1 AND state = 'succeeded' LIMIT 1",
            job,
        )
        return True if found else None

    await until(finished)


async def _second_job(
    cluster: _Cluster, arch: str, weight: float, size: int
) -> tuple[UUID, dict[str, Any]]:
    """Submit a job while another runs: it and when it started (its first query's start)."""
    job = await _submit(cluster, arch, weight, size)

    async def started() -> asyncpg.Record | None:
        row: asyncpg.Record | None = await cluster.pool.fetchrow(
            "SELECT s.submitted_at, (SELECT min(q.started_at) FROM inference_queries q"
            " WHERE q.job_id = s.job_id) AS first FROM job_status s WHERE s.job_id = $1",
            job,
        )
        return row if row is not None and row["first"] is not None else None

    row = await until(started)
    start_s = (row["first"] - row["submitted_at"]).total_seconds()
    stages = await _start_stages(cluster.pool, job, row["submitted_at"])
    return job, {
        "submitted_at": row["submitted_at"],
        "first": row["first"],
        "start_s": start_s,
        "stages_s": stages,
    }


async def _start_stages(pool: asyncpg.Pool, job: UUID, submitted_at: datetime) -> dict[str, Any]:
    """Where a job's start went, by the replica that ran its first query: from the job's
    submission to that replica's PROCESSING (its process started in its sandbox), to its model
    loaded (the agent's note in its log, once the load has answered), to the query's start."""

    async def found() -> asyncpg.Record | None:
        row: asyncpg.Record | None = await pool.fetchrow(
            "SELECT q.started_at AS first,"
            " (SELECT min(e.recorded_at) FROM events e WHERE e.stream_id = 'job-' || q.replica"
            "  AND e.type = 'JobProcessing') AS processing,"
            " (SELECT min(l.at) FROM job_logs l WHERE l.job_id = q.replica"
            "  AND l.stream = 'system' AND l.line LIKE '[trainyard] model loaded in %') AS loaded"
            " FROM inference_queries q WHERE q.job_id = $1 ORDER BY q.started_at LIMIT 1",
            job,
        )
        # The agent's note reaches the log table in its next flush.
        return row if row is not None and row["loaded"] is not None else None

    row = await until(found)
    marks = (submitted_at, row["processing"], row["loaded"], row["first"])
    names = ("to_replica_processing", "to_model_loaded", "to_first_query")
    return {
        name: _seconds((later - earlier).total_seconds())
        for name, earlier, later in zip(names, marks, marks[1:], strict=False)
    }


async def _window(
    pool: asyncpg.Pool, jobs: tuple[UUID, UUID], start: dict[str, Any], window_s: float
) -> dict[str, Any]:
    """Both jobs' rates over `window_s` from the second's first query: (n - 1) results over
    the time from the first to the last of them in the window."""
    begin: datetime = start["first"]
    end = begin + timedelta(seconds=window_s)
    await _sleep_until(pool, end + timedelta(seconds=1))
    rates = []
    for job in jobs:
        times = await _finished(pool, [job], begin, end)
        if len(times) < 2:
            raise RuntimeError(f"job {job} recorded {len(times)} results in the window")
        rates.append((len(times) - 1) / (times[-1] - times[0]))
    ratio = rates[0] / rates[1]
    return {
        "rates_qps": [round(r, 3) for r in rates],
        "ratio": ratio,
        "ratio_error": abs(ratio - 1),
        "window_s": window_s,
    }


async def _finished(
    pool: asyncpg.Pool, jobs: list[UUID], begin: datetime, end: datetime
) -> list[float]:
    """When each result of `jobs` recorded in [begin, end) was, in seconds since `begin`."""
    rows = await pool.fetch(
        "SELECT extract(epoch FROM finished_at - $2)::float8 AS at FROM inference_queries"
        " WHERE job_id = ANY($1::uuid[]) AND finished_at >= $2 AND finished_at < $3"
        " AND state = 'succeeded' ORDER BY finished_at",
        jobs,
        begin,
        end,
    )
    return [row["at"] for row in rows]


async def _kill_replica(cluster: _Cluster, job: UUID) -> None:
    """kill -9 of the `runners.serve` process of one of the job's replicas holding a query."""

    async def holding() -> UUID | None:
        replica: UUID | None = await cluster.pool.fetchval(
            "SELECT replica FROM inference_queries WHERE job_id = $1 AND state = 'running' LIMIT 1",
            job,
        )
        return replica

    replica = await until(holding)
    for agent in cluster.agents:
        with contextlib.suppress(ValueError):
            os.kill(replica_process(agent.name, agent.work_dir, replica), signal.SIGKILL)
            return
    raise RuntimeError(f"no process of replica {replica} found")


async def _recovery(
    cluster: _Cluster, jobs: tuple[UUID, ...], kill: Callable[[], Any]
) -> dict[str, Any]:
    """The cluster's rate before `kill`, and how long after it until the next FORWARD_S
    seconds hold 90 % of that again."""
    killed_at: datetime = await cluster.pool.fetchval("SELECT now()")
    await kill()
    await _sleep_until(cluster.pool, killed_at + timedelta(seconds=2 * FORWARD_S + DOWN_S))
    before = await _finished(
        cluster.pool, list(jobs), killed_at - timedelta(seconds=BEFORE_S), killed_at
    )
    rate = len(before) / BEFORE_S
    after = await _finished(
        cluster.pool, list(jobs), killed_at, killed_at + timedelta(seconds=2 * FORWARD_S + DOWN_S)
    )
    recovery = None
    for step in range(int((FORWARD_S + DOWN_S) / STEP_S) + 1):
        t = step * STEP_S
        held = sum(1 for at in after if t <= at < t + FORWARD_S)
        if held >= 0.9 * rate * FORWARD_S:
            recovery = t
            break
    return {
        "rate_before_qps": round(rate, 3),
        "results_after": len([at for at in after if at < FORWARD_S]),
        "recovery_s": None if recovery is None else round(recovery, 3),
    }


async def _integrity(
    pool: asyncpg.Pool, auditor: asyncpg.Connection, jobs: tuple[UUID, ...], end: datetime
) -> dict[str, Any]:
    """Once every query started before `end` has finished (or FINISH_S passed)."""

    async def settled() -> bool | None:
        unfinished = await pool.fetchval(
            "SELECT count(*) FROM inference_queries WHERE job_id = ANY($1::uuid[])"
            " AND started_at < $2 AND finished_at IS NULL",
            list(jobs),
            end,
        )
        return True if unfinished == 0 else None

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(FINISH_S):
            await until(settled)
    row = await auditor.fetchrow(
        "SELECT count(*) FILTER (WHERE started_at < $2 AND state <> 'succeeded') AS lost,"
        " count(*) - count(DISTINCT (job_id, index)) AS duplicates,"
        " count(*) FILTER (WHERE tries > 1) AS retried, count(*) AS queries"
        " FROM audit.inference_queries WHERE job_id = ANY($1::uuid[])",
        list(jobs),
        end,
    )
    if row is None:
        raise RuntimeError("the audit view answered no row")
    missing = await pool.fetchval(
        "SELECT coalesce(sum(j.started - (SELECT count(*) FROM inference_queries q"
        " WHERE q.job_id = j.job_id)), 0)::bigint FROM inference_jobs j"
        " WHERE j.job_id = ANY($1::uuid[])",
        list(jobs),
    )
    return {
        "lost": row["lost"] + missing,
        "duplicates": row["duplicates"],
        "retried": row["retried"],
        "recorded": row["queries"],
    }


async def _stats_exact(cluster: _Cluster, job: UUID) -> bool:
    """The API's figures against those recomputed from the audit view's rows, both read while
    no query of the job finished (its queries go on until it is cancelled): the API's figures
    the same before and after the rows were read, tried STATS_READS times."""
    for _ in range(STATS_READS):
        view = await cluster.call("GET", f"/v1/jobs/{job}/stats")
        rows = await cluster.auditor.fetch(
            "SELECT latency_ms FROM audit.inference_queries WHERE job_id = $1"
            " AND finished_at IS NOT NULL",
            job,
        )
        again = await cluster.call("GET", f"/v1/jobs/{job}/stats")
        # Counts and latency alone: the rates' window slides with the clock.
        if all(again[key] == view[key] for key in ("queries", "latency_ms")):
            break
    else:
        raise RuntimeError(f"job {job}'s queries kept finishing: no quiet moment to compare")
    times = sorted(row["latency_ms"] for row in rows)
    if view["queries"]["finished"] != len(times):
        return False
    if not times:
        return view["latency_ms"] is None
    latency = view["latency_ms"]
    expected = {
        "mean": statistics.fmean(times),
        "std": statistics.pstdev(times),
        "min": times[0],
        "max": times[-1],
        "median": _percentile(times, 0.5),
        "p90": _percentile(times, 0.9),
        "p95": _percentile(times, 0.95),
        "p99": _percentile(times, 0.99),
    }
    return all(math.isclose(latency[k], v, rel_tol=1e-9, abs_tol=1e-6) for k, v in expected.items())


def _percentile(ordered: list[float], fraction: float) -> float:
    """Postgres's percentile_cont: linear between the two nearest ranks."""
    at = fraction * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


async def _sleep_until(pool: asyncpg.Pool, instant: datetime) -> None:
    """Sleep until the database's clock (the one results are recorded by) passes `instant`."""
    now: datetime = await pool.fetchval("SELECT now()")
    await asyncio.sleep(max(0.0, (instant - now).total_seconds()))


def _seconds(value: float) -> float:
    return round(value, 3)
