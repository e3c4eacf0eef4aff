"""Chaos for serving: kill -9 a replica, the agent and the control plane while asynchronous
tasks run, with real processes (`trainyard serve`, `trainyard agent`, replicas running
`runners.serve`) on a real Postgres. Every accepted task finishes, with its exact result,
produced once: its record holds one run of its step, and no batch recorded it twice."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import psutil
import pytest

from harness import processes
from harness.processes import Cluster
from runners.config import SERVE_DIR
from tests.cluster import learner_space
from tests.controlplane.deployments.serving import metadata
from tests.polling import eventually

TTL_S = 3.0
HEARTBEAT_S = 0.5
TASKS = 60
TRIPLE = (
    b"import time\n\ndef predict(batch):\n    time.sleep(0.05)\n    return [x * 3 for x in batch]\n"
)


@pytest.fixture
async def cluster(db_url: str, pool: asyncpg.Pool, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with processes.cluster(db_url, learner_space(), pool) as running:
        await running.add_plane()
        yield running


async def call(
    cluster: Cluster, method: str, path: str, **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {cluster.token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, cluster.planes[0].url + path, headers=headers, **kwargs) as r,
    ):
        body: dict[str, Any] = await r.json() if r.content_type == "application/json" else {}
        return r.status, body


def replicas() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline[-2:] == ["-m", "runners.serve"]:
            found.append(process)
    return found


async def test_async_tasks_survive_kill_9_of_a_replica_the_agent_and_the_control_plane(
    cluster: Cluster, pool: asyncpg.Pool
) -> None:
    agent = await cluster.add_agent(ttl_s=TTL_S, heartbeat_s=HEARTBEAT_S)
    form = aiohttp.FormData()
    form.add_field("publication", json.dumps({"metadata": metadata("triple:predict")}))
    form.add_field("artifact", TRIPLE, filename="triple.py")
    status, body = await call(cluster, "POST", "/v1/models/triple/versions", data=form)
    assert status == 201, body
    request = {"name": "triple", "model": "triple", "replicas": 2}
    request["serving"] = {"max_batch_size": 4, "max_wait_ms": 2, "memo": False}
    status, body = await call(cluster, "POST", "/v1/deployments", json=request)
    assert status == 201, body
    await eventually(lambda: _serving(cluster, 2), seconds=60)

    accepted: list[tuple[str, int]] = []
    busy: list[psutil.Process] = []
    for n in range(TASKS):
        status, body = await call(
            cluster, "POST", "/v1/deployments/triple/predict", json={"inputs": [n], "async": True}
        )
        assert status == 202, body
        accepted.append((body["task_id"], n))
        if n == TASKS // 4:
            await eventually(lambda: _busy_replica(pool, busy), seconds=30)
            busy[0].kill()  # kill -9 one replica with a batch in hand
        if n == TASKS // 2:
            await agent.kill()
            await agent.start(cluster.pool)
    plane = cluster.planes[0]
    await plane.kill()
    await plane.start()

    ids = [task_id for task_id, _ in accepted]

    async def all_finished() -> bool:
        done = await pool.fetchval(
            "SELECT count(*) FROM serving_tasks WHERE task_id = ANY($1::uuid[]) "
            "AND state IN ('succeeded', 'failed')",
            ids,
        )
        return bool(done == len(ids))

    await eventually(all_finished, seconds=120)
    rows = {
        str(r["task_id"]): r
        for r in await pool.fetch(
            "SELECT task_id, state, output, error, step_times FROM serving_tasks "
            "WHERE task_id = ANY($1::uuid[])",
            ids,
        )
    }
    assert len(rows) == TASKS  # nothing lost
    for task_id, n in accepted:
        row = rows[task_id]
        assert row["state"] == "succeeded", row["error"]
        assert json.loads(row["output"]) == [3 * n]
        assert len(json.loads(row["step_times"])) == 1  # produced once
    recorded = await pool.fetchval(
        "SELECT coalesce(sum(tasks), 0) FROM serving_batches WHERE deployment = 'triple' "
        "AND outcome = 'succeeded'"
    )
    assert recorded == TASKS  # no batch recorded a task that another had recorded
    retried = await pool.fetchval(
        "SELECT count(*) FROM serving_tasks WHERE task_id = ANY($1::uuid[]) AND tries > 1", ids
    )
    assert retried >= 1  # the killed replica's batch was run again, elsewhere


async def _busy_replica(pool: asyncpg.Pool, found: list[psutil.Process]) -> bool:
    """Whether a replica process runs a task now; if so, it is appended to `found`. A
    replica's folder is named for its job (`learner_dir`), which the task's claim names."""
    jobs = await pool.fetch("SELECT DISTINCT replica FROM serving_tasks WHERE state = 'running'")
    for process in replicas():
        with contextlib.suppress(psutil.Error):
            serve_dir = process.environ().get(SERVE_DIR, "")
            if any(str(job["replica"]) in serve_dir for job in jobs):
                found.append(process)
                return True
    return False


async def _serving(cluster: Cluster, count: int) -> bool:
    status, view = await call(cluster, "GET", "/v1/deployments/triple")
    states = [r["state"] for r in view.get("replica_jobs", [])]
    return status == 200 and states.count("PROCESSING") == count
