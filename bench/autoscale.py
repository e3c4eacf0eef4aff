"""`trainyard bench autoscale`: how long an autoscaled deployment takes to follow its load, with
real processes on a scratch database (the cluster of `trainyard bench serving`: a served control
plane, one process-runtime agent).

The model, `sleepy`, sleeps SLEEP_S per call and answers 0 per item; its deployment `auto` has
`max_batch_size` 1 (one request per call, so one replica answers at most 1/SLEEP_S requests a
second), memo off, each replica REPLICA_CPUS CPUs (so that MAX_REPLICAS fit on a small
machine), and autoscaling from 0 to MAX_REPLICAS at TARGET_IN_FLIGHT request(s) in flight per
replica, `scale_down_delay_s` DELAY_S.

- `cold_start_s`: from zero replicas, one synchronous prediction's time from its sending to its
  answer (it is queued, the lifecycle manager's sweep sees it waiting and starts a replica, the
  replica starts, loads the model and claims it). `cold_start_autoscaled_s`: of that, until the
  `DeploymentAutoscaled` event that asked for the replica was recorded (the sweep's share).
- `scale_up_s`: then, with that one replica serving, `clients` closed-loop clients start sending
  (each a synchronous prediction after another): the time from the load's start to the first
  answer by a replica other than the first (a new replica serving). `scale_up_full_s`: until
  answers have come from as many replicas as the load needs (`clients` over TARGET_IN_FLIGHT,
  at most MAX_REPLICAS), `replicas_serving` how many did by LOAD_S.
- `scale_to_zero_s`: from the load's end until the deployment has no replica job left (its
  `scale_down_delay_s`, DELAY_S, included: it scales down only that long after its last change,
  and to zero only once idle that long). The load ends at its last task's finish as the control
  plane stamped it (`finished_at`), where the autoscaler's idle time starts: the clients learn
  of it later (a response on its way, a 202's task read every PROBE_S), and timed from then, it
  came out 18 ms shorter than the delay once.
- `moves`: every `DeploymentAutoscaled` of the run (replicas before and after, the load read).

Everything shares this machine's CPUs (Postgres, the control plane, the agent, the replicas,
the clients), so the figures are this machine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench.scratch import scratch_database
from bench.serving import _body, _Cluster, _cluster, _publish
from controlplane.database import create_pool

SLEEP_S = 0.05
SLEEPY_SOURCE = (
    b"import time\n\n\ndef predict(batch):\n    time.sleep(0.05)\n    return [0] * len(batch)\n"
)
TARGET_IN_FLIGHT = 1.0
MAX_REPLICAS = 4
DELAY_S = 5.0
REPLICA_CPUS = 0.25
REPLICA_MEMORY_MB = 256
LOAD_S = 60.0
"""The longest the load runs waiting for the replicas it needs."""
ZERO_S = 120.0
"""The longest the run waits for the deployment to go back to zero."""
ANSWER_S = 120.0
"""The longest a prediction may take (a cold start included)."""
PROBE_S = 0.05


@dataclass
class _Load:
    """What the closed-loop clients saw: when each replica first answered; `enough` set once
    `needed` replicas have (the one that served before, `first`, among them)."""

    started: float
    first: str
    needed: int
    first_answer: dict[str, float] = field(default_factory=dict)
    answers: int = 0
    last_finished: float | None = None
    """The latest `finished_at` of the tasks answered, in seconds since the epoch."""
    failures: list[str] = field(default_factory=list)
    enough: asyncio.Event = field(default_factory=asyncio.Event)

    def answered(self, task: dict[str, Any]) -> None:
        finished = datetime.fromisoformat(task["finished_at"]).timestamp()
        self.last_finished = max(finished, self.last_finished or finished)
        replica = task["times"]["steps"][0]["replica"]
        self.answers += 1
        self.first_answer.setdefault(replica, time.monotonic())
        if len(self.first_answer.keys() - {self.first}) >= self.needed - 1:
            self.enough.set()


async def run(url: str, *, clients: int, progress: bool = False) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr)

    async with scratch_database(url, "autoscale") as database:
        pool = await create_pool(database, min_size=1, max_size=4)
        try:
            with tempfile.TemporaryDirectory(prefix="trainyard-autoscale-") as home:
                root = Path(home)
                # Passable by the replicas, which run as users of their own (the agent is root).
                os.chmod(root, 0o711)
                async with _cluster(database, root, pool) as cluster:
                    return await _measure(cluster, clients, say)
        finally:
            await pool.close()


async def _measure(cluster: _Cluster, clients: int, say: Callable[[str], None]) -> dict[str, Any]:
    say("autoscale: publishing sleepy")
    await _publish(cluster, "sleepy", SLEEPY_SOURCE, "sleepy:predict")
    autoscaling = {
        "min_replicas": 0,
        "max_replicas": MAX_REPLICAS,
        "target_in_flight": TARGET_IN_FLIGHT,
        "scale_down_delay_s": DELAY_S,
    }
    request = {
        "name": "auto",
        "model": "sleepy",
        "resources": {"cpus": REPLICA_CPUS, "memory_mb": REPLICA_MEMORY_MB},
        "serving": {"max_batch_size": 1, "memo": False},
        "autoscaling": autoscaling,
    }
    await cluster.call("POST", "/v1/deployments", request)
    say("autoscale: cold start (a request to zero replicas)")
    sent_at = time.time()
    began = time.monotonic()
    task = await _answer(cluster, 0)
    cold_start_s = time.monotonic() - began
    first = task["times"]["steps"][0]["replica"]
    moves = await _moves(cluster)
    autoscaled_at = moves[0]["at"] if moves else None
    needed = min(MAX_REPLICAS, math.ceil(clients / TARGET_IN_FLIGHT))
    say(f"autoscale: {clients} clients against one replica")
    load = _Load(started=time.monotonic(), first=first, needed=needed)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        for n in range(clients):
            group.create_task(_client(cluster, n + 1, load, stop))
        try:
            # Reported if it passes: fewer replicas serving than needed.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LOAD_S):
                    await load.enough.wait()
        finally:
            stop.set()
    ended = time.time() if load.last_finished is None else load.last_finished
    new = sorted(at - load.started for replica, at in load.first_answer.items() if replica != first)
    say("autoscale: back to zero")
    scale_to_zero_s = await _until_zero(cluster, ended)
    return {
        "cold_start_s": round(cold_start_s, 3),
        "cold_start_autoscaled_s": (
            None if autoscaled_at is None else round(autoscaled_at - sent_at, 3)
        ),
        "scale_up_s": round(new[0], 3) if new else None,
        "scale_up_full_s": round(new[needed - 2], 3) if len(new) >= needed - 1 else None,
        "replicas_needed": needed,
        "replicas_serving": 1 + len(new),
        "scale_to_zero_s": None if scale_to_zero_s is None else round(scale_to_zero_s, 3),
        "answers": load.answers,
        "failures": load.failures[:5],
        "moves": [{k: v for k, v in m.items() if k != "at"} for m in await _moves(cluster)],
        "settings": {
            "clients": clients,
            "sleep_s": SLEEP_S,
            "max_batch_size": 1,
            "memo": False,
            "replica_cpus": REPLICA_CPUS,
            "autoscaling": autoscaling,
            "sweep_s": 1.0,
            "runtime": "process",
        },
    }


async def _client(cluster: _Cluster, n: int, load: _Load, stop: asyncio.Event) -> None:
    """One closed-loop client: a prediction after another until `stop`."""
    while not stop.is_set():
        try:
            task = await _answer(cluster, n)
        except (RuntimeError, aiohttp.ClientError, TimeoutError) as exc:
            load.failures.append(repr(exc))
            continue
        load.answered(task)


async def _answer(cluster: _Cluster, n: int) -> dict[str, Any]:
    """A synchronous prediction's finished task: the response's, or, answered 202 (past the
    synchronous wait), its task read until it has finished."""
    async with asyncio.timeout(ANSWER_S):
        async with cluster.session.post(
            f"{cluster.plane.url}/v1/deployments/auto/predict",
            data=_body([n]),
            headers={**cluster.headers, "Content-Type": "application/json"},
        ) as response:
            if response.status not in (200, 202):
                raise RuntimeError(f"predict: {response.status} {await response.text()}")
            task: dict[str, Any] = await response.json()
        while task["status"] not in ("succeeded", "failed"):
            await asyncio.sleep(PROBE_S)
            task = await cluster.call("GET", f"/v1/tasks/{task['task_id']}")
    if task["status"] != "succeeded" or task.get("outputs") != [0]:
        raise RuntimeError(f"predict: {task}")
    return task


async def _moves(cluster: _Cluster) -> list[dict[str, Any]]:
    """The deployment's autoscaled moves, each with the instant it was recorded (`at`, epoch
    seconds)."""
    history = await cluster.call("GET", "/v1/deployments/auto/history")
    moves = []
    for entry in history["history"]:
        if entry["event"] == "DeploymentAutoscaled":
            at = datetime.fromisoformat(entry["at"]).timestamp()
            moves.append({**entry["data"], "at": at})
    return moves


async def _until_zero(cluster: _Cluster, since: float) -> float | None:
    """Seconds from `since` (since the epoch) until the deployment has no replica left."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(ZERO_S):
            while True:
                view = await cluster.call("GET", "/v1/deployments/auto")
                if view["replicas"] == 0 and not view["replica_jobs"]:
                    return time.time() - since
                await asyncio.sleep(PROBE_S)
    return None
