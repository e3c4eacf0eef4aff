"""`trainyard bench serving`: model serving through the API against Ray Serve and BentoML, and
what a kill -9 of each part does to asynchronous tasks; with real processes on a scratch
database.

The cluster: a control plane process (`trainyard serve`) and one node agent process (`trainyard
agent --runtime process`, no GPUs, lease TTL LEASE_TTL_S) whose TRAINYARD_ARTIFACTS_DIR is the
control plane's, so that it finds the model repository's blobs; a tenant and its token. Two
models are published through `POST /v1/models/{name}/versions`: `mlp`, the 784-256-10 PyTorch
MLP of `bench.serving_model` (one torch thread per replica), and `noop`, which computes nothing.
Each measurement deploys what it measures (`POST /v1/deployments`), waits until every replica
has answered a request (its model loaded), measures, and scales the deployment to 0, so that
no other replica's feed competes for the agent, the database or the CPUs (every replica's feed
is woken by every task queued).

- `concurrency`: the deployment `mlp`, REPLICAS replicas, `max_batch_size` MAX_BATCH_SIZE,
  `max_wait_ms` MAX_WAIT_MS, memo off (the deployment's setting), under closed-loop clients
  (`bench.closed_loop`) at each of CONCURRENCIES: each request `POST
  /v1/deployments/mlp/predict` with one item (INPUTS distinct inputs in turn), answered 200
  with that item's logits. The warm-up before each window is WARMUP_S (at most the window).
  Trainyard's figures add `mean_batch_items`, the mean size of the batches its replicas ran
  (warm-up included; also for `no_batching`, where it is 1).
  Ray Serve and BentoML serve the same model with the same replicas and batch size
  (`bench.serving_peers`, in this run, on this machine; BentoML sets its own batch window),
  measured by the same clients; `throughput_ratio_vs_*` is Trainyard's throughput over the
  peer's at concurrency HIGH, `p99_ms` each system's p99 at each concurrency, `tail_growth` its
  p99 at concurrency TAIL over its p99 at 1 (Trainyard's; `tail_growth_peers` the peers').
  Synchronous predictions take the direct path (docs/user-guide.md, "Which path a prediction
  takes"); the kill -9 run's asynchronous ones, the queue.
- `batching_gain`: `mlp`'s throughput at HIGH over that of `mlp-nobatch`, the same deployment
  with `max_batch_size` 1.
- `noop_p50_ms`, `noop_p99_ms`: the deployment `noop` (one replica, `max_batch_size` 1, so a
  request never waits for a batch to fill; memo off) at concurrency 1: the serving path's own
  latency, request to answer through the API, the agent's channel and the replica. `noop` adds
  the medians of the tasks' own times (warm-up included): `task_request_p50_ms`, from the
  request's arrival at the control plane to its answer; `task_invocation_p50_ms`, the agent's call
  of the replica; `task_inference_p50_ms`, the entry point's. `control_plane_cpu_ms` and
  `agent_cpu_ms`: the CPU time (user and system, from /proc) each of those processes spent
  over the warm-up and the window, per request answered meanwhile, their background work
  included: what a request costs each, which other load on the machine disturbs less than
  the latencies.
- `memo_hit_p99_ms`: the deployment `mlp-memo` (one replica, memo on): one input sent once
  (a miss, run by the replica), then sent again and again, each answer checked to be the
  memo's (`memo: hit`), at concurrency 1 (with `control_plane_cpu_ms` and `agent_cpu_ms` as
  for `noop`) and 8, in `memo_hit`.
- kill -9: `mlp` again, `tasks` asynchronous tasks (`"async": true`, 202 with the task), each
  of its own input, sent by SUBMITTERS clients spread over SUBMIT_SPAN_S; as they are
  accepted, SIGKILL (a) the replica process (`runners.serve`) of a replica holding tasks (if
  one does within a second), once a quarter are accepted, (b) the agent, once half are,
  started again DOWN_S later, (c) the control plane, once three quarters are (and the agent is
  back), started again DOWN_S later. A submission refused or cut off is sent again (a client
  retries until it is accepted). Then, from the database, once every task has finished (or
  FINISH_S passed): `async_lost`, the accepted tasks that are missing, unfinished or failed
  (`async_failed` counts the failed among them); `async_duplicated`, the tasks whose result
  was recorded more than once (more than one entry in `step_times`, which gets one per
  recorded step), plus any batch that more tasks name than it recorded (a `serving_batches`
  row count mismatch); `async_retried`, the tasks claimed more than once (`tries` > 1: they
  were requeued by a kill); `async_wrong_outputs`, outputs that are not
  exactly what the MLP computes here, on the CPU, for the input its client sent, in a batch of
  the same size (a row's logits depend on the batch's size, which picks the matrix kernel, not
  on the other rows). `async` also tells how many tasks were queued and running at each kill
  and how many the replicas held (`in_flight_at_kill`), the submissions that were recorded
  though never acknowledged (`unacknowledged`: the control plane died before answering, and
  the client's retry is a task of its own), and `fenced_results`: results replicas produced
  that were discarded because the task had been requeued meanwhile (the claim fence at work).

Everything (Postgres, the control plane, the agent, the replicas, the peers and the clients)
shares this machine's CPUs, so the figures are this machine's, not a server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import aiohttp
import asyncpg

from bench.closed_loop import REQUEST_TIMEOUT_S, closed_loop
from bench.model_repository import ms
from bench.scratch import scratch_database
from bench.serving_model import (
    MLP_ENTRY_POINT,
    MLP_SOURCE,
    NOOP_ENTRY_POINT,
    mlp_artifact,
    noop_artifact,
    sample_input,
)
from bench.serving_peers import REPLICAS, WARMUP_S, run_bentoml, run_ray_serve
from controlplane.agents.events import NodeRegistered
from controlplane.agents.nodes import node_stream
from controlplane.database import create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.projections.runner import ProjectionRunner
from controlplane.settings import ARTIFACTS_DIR_ENV
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import create_tenant
from harness.agent_login import agent_login_url
from harness.processes import kill_learner, replica_process, until
from harness.served import ServedControlPlane
from node_agent.process_runtime import find_learners

CONCURRENCIES = (1, 8, 32, 256)
HIGH = 32
"""The concurrency the throughput ratios and the batching gain are taken at."""
TAIL = 256
"""The concurrency `tail_growth` compares with 1 (Ray Serve's proxy: 46x, ray issue 55473)."""
MAX_BATCH_SIZE = 8
MAX_WAIT_MS = 5.0
INPUTS = 256
"""Distinct inputs each measurement's clients send in turn (made before, off the clock)."""
MEMO_CONCURRENCIES = (1, 8)
TENANT = "bench"
NODE = "bench-serving"
LEASE_TTL_S = 3.0
HEARTBEAT_S = 0.5
DOWN_S = 0.5
"""How long a killed agent or control plane stays down before it is started again."""
SUBMITTERS = 8
SUBMIT_SPAN_S = 4.0
"""The kill -9 run's submissions are spread over this long, so that each kill finds tasks
arriving and running (the agent's and the control plane's restarts take about a second)."""
READY_S = 180.0
"""For a deployment's replicas to start and load their model (each imports torch)."""
STOPPED_S = 60.0
"""For a stopped agent to exit."""
FINISH_S = 180.0
"""For the kill -9 run's tasks to finish: a task held by a replica that stopped answering waits
for its deployment's task timeout (30 s) before it is requeued."""
RETRY_S = 0.05
PROBE_S = 0.05
KILL_PROBE_S = 0.002
LOGITS = 10
KILL_SEED = 1_000_000
"""Inputs of the kill -9 run: seeds from here, none sent before."""

TARGETS = {
    "throughput_ratio_vs_ray_serve": ">= 2",
    "throughput_ratio_vs_bentoml": ">= 1.5",
    "noop_p50_ms": "<= 1.5",
    "noop_p99_ms": "<= 5",
    "tail_growth": "<= 10",
    "memo_hit_p99_ms": "<= 2",
    "batching_gain": ">= 3",
    "async_lost": "0",
    "async_duplicated": "0",
}

Say = Callable[[str], None]
Figures = dict[str, float]
Check = Callable[[dict[str, Any]], bool]


async def run(
    url: str, *, duration_s: float, tasks: int, peers: bool, progress: bool = False
) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr)

    warmup_s = min(WARMUP_S, duration_s)
    load_before = os.getloadavg()[0]
    ours = await _trainyard(url, duration_s, warmup_s, tasks, say)
    ray: dict[int, Figures] | None = None
    bento: dict[int, Figures] | None = None
    notes = [
        f"Postgres, the control plane, the agent, the replicas, the peers and the clients "
        f"share this machine's {os.cpu_count()} CPUs",
        "memo off on mlp, mlp-nobatch and noop (the deployments' setting), on for mlp-memo",
    ]
    if peers:
        # Ray prints its raylet's errors on stdout (a replica killed at its shutdown, say),
        # from threads of its own: stdout is the JSON object's alone.
        with contextlib.redirect_stdout(sys.stderr):
            say("serving: Ray Serve ...")
            ray = await run_ray_serve(
                CONCURRENCIES,
                max_batch_size=MAX_BATCH_SIZE,
                max_wait_ms=MAX_WAIT_MS,
                duration_s=duration_s,
            )
            say("serving: BentoML ...")
            bento = await run_bentoml(
                CONCURRENCIES,
                max_batch_size=MAX_BATCH_SIZE,
                max_wait_ms=MAX_WAIT_MS,
                duration_s=duration_s,
            )
        notes.append(
            "BentoML has no batch window to set: its dispatcher sizes the wait itself "
            "(max_wait_ms does not apply to it)"
        )
    else:
        notes.append("peers left out (--no-peers)")
    if peers and ray is None:
        notes.append("Ray Serve left out: not installed (the `bench` extra)")
    if peers and bento is None:
        notes.append("BentoML left out: not installed (the `bench` extra)")
    mlp: dict[int, Figures] = ours["concurrency"]
    systems = {"trainyard": mlp, "ray_serve": ray, "bentoml": bento}
    return {
        "concurrency": {
            c: {name: None if f is None else f[c] for name, f in systems.items()}
            for c in CONCURRENCIES
        },
        "throughput_ratio_vs_ray_serve": _ratio(mlp, ray),
        "throughput_ratio_vs_bentoml": _ratio(mlp, bento),
        "p99_ms": {
            c: {name: None if f is None else f[c]["p99_ms"] for name, f in systems.items()}
            for c in CONCURRENCIES
        },
        "tail_growth": _growth(mlp),
        "tail_growth_peers": {"ray_serve": _growth(ray), "bentoml": _growth(bento)},
        "noop_p50_ms": ours["noop"]["p50_ms"],
        "noop_p99_ms": ours["noop"]["p99_ms"],
        "noop": ours["noop"],
        "memo_hit_p99_ms": ours["memo_hit"][1]["p99_ms"],
        "memo_hit": ours["memo_hit"],
        "batching_gain": round(
            mlp[HIGH]["throughput_rps"] / ours["no_batching"]["throughput_rps"], 2
        ),
        "no_batching": ours["no_batching"],
        **{f"async_{name}": ours["async"][name] for name in _ASYNC_FIGURES},
        "async": ours["async"],
        "targets": TARGETS,
        "settings": {
            "replicas": REPLICAS,
            "max_batch_size": MAX_BATCH_SIZE,
            "max_wait_ms": MAX_WAIT_MS,
            "memo": "off (deployment setting memo=false); mlp-memo: on",
            "noop": {"replicas": 1, "max_batch_size": 1, "memo": False},
            "no_batching": {"replicas": REPLICAS, "max_batch_size": 1, "memo": False},
            "torch_threads_per_replica": 1,
            "runtime": "process",
            "duration_s": duration_s,
            "warmup_s": warmup_s,
            "distinct_inputs": INPUTS,
            "tasks": tasks,
            "cpus": os.cpu_count(),
            "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]},
        },
        "notes": notes,
    }


_ASYNC_FIGURES = ("lost", "duplicated", "retried", "failed", "wrong_outputs")


def _growth(figures: dict[int, Figures] | None) -> float | None:
    """p99 at concurrency TAIL over p99 at 1."""
    if figures is None:
        return None
    return round(figures[TAIL]["p99_ms"] / figures[1]["p99_ms"], 2)


def _ratio(ours: dict[int, Figures], theirs: dict[int, Figures] | None) -> float | None:
    if theirs is None:
        return None
    return round(ours[HIGH]["throughput_rps"] / theirs[HIGH]["throughput_rps"], 2)


async def _trainyard(
    url: str, duration_s: float, warmup_s: float, tasks: int, say: Say
) -> dict[str, Any]:
    async with scratch_database(url, "serving") as database:
        pool = await create_pool(database, min_size=1, max_size=4)
        try:
            with tempfile.TemporaryDirectory(prefix="trainyard-serving-") as home:
                root = Path(home)
                # Passable by the replicas, which run as users of their own (the agent is root).
                os.chmod(root, 0o711)
                async with _cluster(database, root, pool) as cluster:
                    return await _measure(cluster, duration_s, warmup_s, tasks, say)
        finally:
            await pool.close()


class _Agent:
    """`trainyard agent` as a child process with the control plane's artifacts folder, to kill
    -9 and start again (same work directory: same identity, its replicas re-adopted)."""

    def __init__(self, database_url: str, root: Path, artifacts: Path) -> None:
        self.database_url = database_url
        self.work_dir = root / "agent"
        self.artifacts = artifacts
        self.log = root / "agent.log"
        self.process: asyncio.subprocess.Process | None = None
        self._login_url: str | None = None

    async def start(self, store: EventStore) -> None:
        """Spawn it; return once it has registered its node."""
        before = await _registrations(store)
        # Once: a restart after a kill should cost only the agent's own start.
        self._login_url = self._login_url or await agent_login_url(self.database_url, NODE)
        options = ["--name", NODE, "--runtime", "process", "--fake-gpus", "0"]
        options += ["--work-dir", str(self.work_dir), "--grace", "2"]
        options += ["--heartbeat", str(HEARTBEAT_S), "--ttl", str(LEASE_TTL_S)]
        env = {
            **os.environ,
            "TRAINYARD_DATABASE_URL": self._login_url,
            ARTIFACTS_DIR_ENV: str(self.artifacts),
        }
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "cli", "agent", *options),
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        try:
            async with asyncio.timeout(READY_S):
                while await _registrations(store) == before:
                    if self.process.returncode is not None:
                        raise RuntimeError(f"the agent exited with {self.process.returncode}")
                    await asyncio.sleep(PROBE_S)
        except (RuntimeError, TimeoutError) as failure:
            raise RuntimeError(
                f"the agent did not start ({failure}); its log:\n{_tail(self.log)}"
            ) from failure

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def kill(self) -> None:
        """kill -9: no clean shutdown, its replicas left running."""
        assert self.process is not None
        self.process.kill()
        await self.process.wait()

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), STOPPED_S)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


async def _registrations(store: EventStore) -> int:
    history = await store.read_stream(node_stream(NODE))
    return sum(isinstance(e.event, NodeRegistered) for e in history)


@dataclass
class _Cluster:
    pool: asyncpg.Pool
    store: EventStore
    plane: ServedControlPlane
    agent: _Agent
    token: str
    session: aiohttp.ClientSession
    """For the benchmark's own requests (publish, deploy, scale, read)."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request to the control plane, with the tenant's token; its JSON answer.
        RuntimeError for an answer that is not a success."""
        async with self.session.request(
            method, self.plane.url + path, json=body, headers=self.headers
        ) as response:
            if response.status >= 300:
                raise RuntimeError(f"{method} {path}: {response.status} {await response.text()}")
            return await response.json()


@asynccontextmanager
async def _cluster(database: str, root: Path, pool: asyncpg.Pool) -> AsyncIterator[_Cluster]:
    store = EventStore(pool, EVENT_REGISTRY)
    runner = ProjectionRunner(pool, store, LogListener(database), [TenantsProjection()])
    issued = await create_tenant(store, runner, TENANT, actor="bench")
    artifacts = root / "artifacts"
    plane = ServedControlPlane(database, root / "plane", env={ARTIFACTS_DIR_ENV: str(artifacts)})
    agent = _Agent(database, root, artifacts)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    try:
        await plane.start()
        await agent.start(store)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            yield _Cluster(pool, store, plane, agent, issued.plaintext, session)
    finally:
        await agent.stop()
        await plane.stop()
        # Replicas outlive their agent by design: those the stopped agent left go too.
        for found in find_learners(NODE, agent.work_dir):
            kill_learner(found)


async def _measure(
    cluster: _Cluster, duration_s: float, warmup_s: float, tasks: int, say: Say
) -> dict[str, Any]:
    say("serving: publishing mlp and noop")
    await _publish(cluster, "mlp", mlp_artifact(), MLP_ENTRY_POINT)
    await _publish(cluster, "noop", noop_artifact(), NOOP_ENTRY_POINT)
    seeds = itertools.count()

    def bodies() -> list[bytes]:
        """INPUTS inputs none of the measurements before have sent."""
        return [_body([sample_input(next(seeds))]) for _ in range(INPUTS)]

    async def measure(name: str, clients: int, check: Check, sent: list[bytes]) -> Figures:
        send = _sender(cluster, name, sent, check)
        return await closed_loop(send, clients, duration_s, warmup_s)

    async def measure_cpu(name: str, check: Check, sent: list[bytes]) -> Figures:
        """`measure` at concurrency 1, and the CPU time the control plane and the agent
        processes spent per request answered meanwhile (warm-up included, their background
        work too: what serving costs each process, less noisy than the latencies on a shared
        machine)."""
        answered = 0

        def counted(task: dict[str, Any]) -> bool:
            nonlocal answered
            answered += 1
            return check(task)

        pids = {"control_plane": cluster.plane.pid, "agent": cluster.agent.pid}
        before = {part: _cpu_s(pid) for part, pid in pids.items()}
        figures = await measure(name, 1, counted, sent)
        spent = {part: _cpu_s(pid) - before[part] for part, pid in pids.items()}
        per_request = {f"{part}_cpu_ms": round(s * 1000 / answered, 3) for part, s in spent.items()}
        return {**figures, **per_request}

    async def measure_batched(name: str, clients: int, sent: list[bytes]) -> Figures:
        """`measure`, and the mean items of the batches the replicas ran meanwhile."""
        since = await cluster.pool.fetchval("SELECT now()")
        figures = await measure(name, clients, _mlp_answer, sent)
        mean = await cluster.pool.fetchval(
            "SELECT avg(items)::float8 FROM serving_batches WHERE deployment = $1 AND at >= $2",
            name,
            since,
        )
        return {**figures, "mean_batch_items": round(mean, 2)}

    say("serving: noop, concurrency 1")
    times: list[dict[str, Any]] = []

    def noop_answer(task: dict[str, Any]) -> bool:
        times.append(task["times"])
        return bool(task.get("outputs") == [0])

    async with _deployment(cluster, "noop", "noop", replicas=1, batch=1, memo=False):
        noop = await measure_cpu("noop", noop_answer, bodies())
    # Where the time goes, as the tasks' records tell it (warm-up answers included).
    for part in ("request_ms", "invocation_ms", "inference_ms"):
        noop[f"task_{part.removesuffix('_ms')}_p50_ms"] = ms(
            statistics.median(t[part] for t in times) / 1000
        )
    say("serving: mlp-memo (memo hits)")
    memo_hit: dict[int, Figures] = {}
    async with _deployment(cluster, "mlp-memo", "mlp", replicas=1, batch=MAX_BATCH_SIZE, memo=True):
        repeated = [_body([sample_input(next(seeds))])]
        # The first time a miss, run by the replica; from then on the memo's.
        await _predict(cluster, "mlp-memo", repeated[0])
        memo_hit[1] = await measure_cpu("mlp-memo", _memo_answer, repeated)
        for clients in MEMO_CONCURRENCIES[1:]:
            memo_hit[clients] = await measure("mlp-memo", clients, _memo_answer, repeated)
    say(f"serving: mlp-nobatch, concurrency {HIGH}")
    async with _deployment(cluster, "mlp-nobatch", "mlp", replicas=REPLICAS, batch=1, memo=False):
        no_batching = await measure_batched("mlp-nobatch", HIGH, bodies())
    concurrency: dict[int, Figures] = {}
    async with _deployment(
        cluster, "mlp", "mlp", replicas=REPLICAS, batch=MAX_BATCH_SIZE, memo=False
    ) as jobs:
        for clients in CONCURRENCIES:
            say(f"serving: mlp, concurrency {clients}")
            concurrency[clients] = await measure_batched("mlp", clients, bodies())
        say(f"serving: kill -9 run, {tasks} asynchronous tasks")
        killed = await _kill_run(cluster, jobs, tasks, say)
    return {
        "concurrency": concurrency,
        "noop": noop,
        "memo_hit": memo_hit,
        "no_batching": no_batching,
        "async": killed,
    }


async def _publish(cluster: _Cluster, name: str, artifact: bytes, entry_point: str) -> None:
    metadata = {
        "title": f"trainyard bench serving: {name}",
        "creators": [{"name": "trainyard bench"}],
        "framework": "pytorch",
        "servable": {
            "entry_point": entry_point,
            "input": {"type": "list"},
            "output": {"type": "list"},
        },
    }
    form = aiohttp.MultipartWriter("form-data")
    part = form.append_json({"metadata": metadata})
    part.set_content_disposition("form-data", name="publication")
    part = form.append(artifact)
    part.set_content_disposition("form-data", name="artifact", filename="model.zip")
    async with cluster.session.post(
        f"{cluster.plane.url}/v1/models/{name}/versions", data=form, headers=cluster.headers
    ) as response:
        if response.status != 201:
            raise RuntimeError(f"publishing {name}: {response.status} {await response.text()}")


@asynccontextmanager
async def _deployment(
    cluster: _Cluster, name: str, model: str, *, replicas: int, batch: int, memo: bool
) -> AsyncIterator[list[UUID]]:
    """The deployment, once each of its replicas has answered; its replica jobs. Scaled to 0
    afterwards, and its replicas waited for until they have stopped."""
    serving = {"max_batch_size": batch, "max_wait_ms": MAX_WAIT_MS, "memo": memo}
    request = {"name": name, "model": model, "replicas": replicas, "serving": serving}
    await cluster.call("POST", "/v1/deployments", request)
    jobs = await _until_answering(cluster, name, replicas)
    try:
        yield jobs
    finally:
        await cluster.call("PATCH", f"/v1/deployments/{name}", {"replicas": 0})

        async def stopped() -> bool | None:
            live = find_learners(NODE, cluster.agent.work_dir)
            return None if any(found.job_id in jobs for found in live) else True

        await until(stopped)


async def _until_answering(cluster: _Cluster, name: str, replicas: int) -> list[UUID]:
    """The deployment's replica jobs, once `replicas` are PROCESSING and each has answered a
    request (a replica takes tasks only once its model is loaded)."""
    async with asyncio.timeout(READY_S):
        while True:
            view = await cluster.call("GET", f"/v1/deployments/{name}")
            jobs = [UUID(r["job_id"]) for r in view["replica_jobs"] if r["state"] == "PROCESSING"]
            if len(jobs) == replicas:
                break
            await asyncio.sleep(PROBE_S)
        answered: set[UUID] = set()
        seeds = itertools.count(-1, -1)  # inputs of no measurement
        while not answered >= set(jobs):
            burst = [_body([sample_input(next(seeds))]) for _ in range(2 * replicas)]
            sent = (_predict(cluster, name, b, loading=True) for b in burst)
            for task in await asyncio.gather(*sent):
                if task is not None:
                    answered.update(UUID(step["replica"]) for step in task["times"]["steps"])
    return jobs


async def _predict(
    cluster: _Cluster, name: str, body: bytes, *, loading: bool = False
) -> dict[str, Any] | None:
    """The task that answered; with `loading` (the replicas may still be loading their model,
    which on a busy machine can take longer than the synchronous wait), None for one queued."""
    async with cluster.session.post(
        f"{cluster.plane.url}/v1/deployments/{name}/predict",
        data=body,
        headers={**cluster.headers, "Content-Type": "application/json"},
    ) as response:
        if loading and response.status == 202:
            return None
        if response.status != 200:
            raise RuntimeError(f"predict on {name}: {response.status} {await response.text()}")
        task: dict[str, Any] = await response.json()
    if task["status"] != "succeeded":
        raise RuntimeError(f"predict on {name}: {task}")
    return task


def _body(inputs: list[Any], **options: Any) -> bytes:
    return json.dumps({"inputs": inputs, **options}).encode()


def _cpu_s(pid: int) -> float:
    """The CPU time (user and system) process `pid` has spent, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    # utime and stime, the 14th and 15th fields (the 12th and 13th after the name's ")").
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sender(
    cluster: _Cluster, name: str, bodies: Sequence[bytes], check: Check
) -> Callable[[aiohttp.ClientSession], Any]:
    """One request of one item (the next of `bodies`); its answer checked by `check`."""
    url = f"{cluster.plane.url}/v1/deployments/{name}/predict"
    headers = {**cluster.headers, "Content-Type": "application/json"}
    turns = itertools.cycle(bodies)

    async def send(session: aiohttp.ClientSession) -> None:
        async with session.post(url, data=next(turns), headers=headers) as response:
            response.raise_for_status()
            status = response.status
            task = await response.json()
        # 202: no result within the synchronous wait, longer than the clients' timeout.
        if status != 200 or task.get("status") != "succeeded" or not check(task):
            raise ValueError(f"{url} answered {status} {str(task)[:300]}")

    return send


def _mlp_answer(task: dict[str, Any]) -> bool:
    outputs = task.get("outputs")
    return isinstance(outputs, list) and len(outputs) == 1 and len(outputs[0]) == LOGITS


def _memo_answer(task: dict[str, Any]) -> bool:
    return task.get("memo") == "hit" and _mlp_answer(task)


class _Submissions:
    """The kill -9 run's tasks as they are accepted: task id to the seed of its input."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.accepted: dict[UUID, int] = {}
        self._more = asyncio.Event()

    def accept(self, task_id: UUID, seed: int) -> None:
        self.accepted[task_id] = seed
        self._more.set()

    async def reached(self, fraction: float) -> None:
        """Once at least `fraction` of the tasks are accepted."""
        while len(self.accepted) < fraction * self.total:
            self._more.clear()
            await self._more.wait()


async def _kill_run(cluster: _Cluster, jobs: list[UUID], tasks: int, say: Say) -> dict[str, Any]:
    await _until_idle(cluster.pool, "mlp")
    started_at = await cluster.pool.fetchval("SELECT now()")
    submissions = _Submissions(tasks)
    seeds = iter(range(KILL_SEED, KILL_SEED + tasks))
    kills: dict[str, Any] = {}
    begun = time.monotonic()

    async def submitter() -> None:
        for seed in seeds:
            # Spread over SUBMIT_SPAN_S: all at once, they would be run before the first kill.
            due = begun + (seed - KILL_SEED) * SUBMIT_SPAN_S / tasks
            await asyncio.sleep(due - time.monotonic())
            body = _body([sample_input(seed)], **{"async": True})
            submissions.accept(await _submit(cluster, body), seed)

    async def killer() -> None:
        await submissions.reached(0.25)
        kills["replica"] = await _kill_replica(cluster, jobs)
        say(f"serving: killed a replica: {kills['replica']}")
        await submissions.reached(0.5)
        in_flight, held = await _holding(cluster.pool, jobs)
        await cluster.agent.kill()
        kills["agent"] = {**in_flight, "held": sum(held.values())}
        await asyncio.sleep(DOWN_S)
        await cluster.agent.start(cluster.store)
        say(f"serving: killed and restarted the agent: {kills['agent']}")
        await submissions.reached(0.75)
        in_flight, held = await _holding(cluster.pool, jobs)
        await cluster.plane.kill()
        kills["control_plane"] = {**in_flight, "held": sum(held.values())}
        await asyncio.sleep(DOWN_S)
        await cluster.plane.start()
        say(f"serving: killed and restarted the control plane: {kills['control_plane']}")

    async with asyncio.TaskGroup() as group:
        group.create_task(killer())
        for _ in range(SUBMITTERS):
            group.create_task(submitter())
    finish_s = await _until_finished(cluster.pool, list(submissions.accepted))
    return await _tally(cluster.pool, submissions.accepted, started_at, kills, finish_s)


async def _submit(cluster: _Cluster, body: bytes) -> UUID:
    """The task's id once the control plane has accepted it (202); sent again while it is
    down or cut the request off, as a client would."""
    url = f"{cluster.plane.url}/v1/deployments/mlp/predict"
    headers = {**cluster.headers, "Content-Type": "application/json"}
    while True:
        try:
            async with cluster.session.post(url, data=body, headers=headers) as response:
                if response.status == 202:
                    return UUID((await response.json())["task_id"])
                if response.status < 500:
                    raise RuntimeError(f"submission refused: {response.status}")
        except (aiohttp.ClientConnectionError, TimeoutError):
            pass  # down, or restarting
        await asyncio.sleep(RETRY_S)


async def _until_idle(pool: asyncpg.Pool, deployment: str) -> None:
    """Until the deployment has no task queued or running (the measurements' last requests,
    abandoned by their clients, still run)."""

    async def idle() -> bool | None:
        busy = await pool.fetchval(
            "SELECT count(*) FROM serving_tasks WHERE deployment = $1 "
            "AND state IN ('queued', 'running')",
            deployment,
        )
        return None if busy else True

    await until(idle)


async def _kill_replica(cluster: _Cluster, jobs: list[UUID]) -> dict[str, int]:
    """kill -9 of the replica process (`runners.serve`, the launcher's child) of the replica
    that holds the most tasks (the first replica if none holds any); `_holding`'s figures,
    `held` being the killed replica's."""
    processes = {job: replica_process(NODE, cluster.agent.work_dir, job) for job in jobs}
    in_flight, held = await _holding(cluster.pool, jobs)
    target = max(held, key=held.__getitem__) if held else jobs[0]
    os.kill(processes[target], signal.SIGKILL)
    return {**in_flight, "held": held.get(target, 0)}


async def _holding(pool: asyncpg.Pool, jobs: list[UUID]) -> tuple[dict[str, int], dict[UUID, int]]:
    """As soon as a replica of `jobs` holds tasks (or after a second): the tasks queued and
    running then, and how many each replica holds."""
    held: dict[UUID, int] = {}
    rows: list[asyncpg.Record] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(1.0):
            while True:
                rows = await pool.fetch(
                    "SELECT state, replica, count(*) AS n FROM serving_tasks "
                    "WHERE deployment = 'mlp' AND state IN ('queued', 'running') "
                    "GROUP BY state, replica"
                )
                held = {
                    row["replica"]: row["n"]
                    for row in rows
                    if row["state"] == "running" and row["replica"] in jobs
                }
                if held:
                    break
                # A task is held for a few milliseconds: looked for that often.
                await asyncio.sleep(KILL_PROBE_S)
    in_flight = {
        state: sum(row["n"] for row in rows if row["state"] == state)
        for state in ("queued", "running")
    }
    return in_flight, held


async def _until_finished(pool: asyncpg.Pool, task_ids: list[UUID]) -> float:
    """Seconds until every task has finished; FINISH_S if some have not by then (they count
    as lost)."""
    started = time.perf_counter()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(FINISH_S):
            while True:
                finished = await pool.fetchval(
                    "SELECT count(*) FROM serving_tasks WHERE task_id = ANY($1::uuid[]) "
                    "AND state IN ('succeeded', 'failed')",
                    task_ids,
                )
                if finished == len(task_ids):
                    break
                await asyncio.sleep(PROBE_S)
    return round(time.perf_counter() - started, 2)


async def _tally(
    pool: asyncpg.Pool,
    accepted: dict[UUID, int],
    started_at: Any,
    kills: dict[str, Any],
    finish_s: float,
) -> dict[str, Any]:
    """The kill -9 run's figures, from the database (see the module's docstring)."""
    rows = await pool.fetch(
        "SELECT task_id, state, tries, output, step_times FROM serving_tasks "
        "WHERE deployment = 'mlp' AND (submitted_at >= $1 OR finished_at >= $1)",
        started_at,
    )
    batches = {
        row["batch_id"]: row
        for row in await pool.fetch(
            "SELECT batch_id, tasks, items FROM serving_batches "
            "WHERE deployment = 'mlp' AND at >= $1",
            started_at,
        )
    }
    by_id = {row["task_id"]: row for row in rows}
    steps = {row["task_id"]: json.loads(row["step_times"]) for row in rows}
    named: dict[UUID, int] = {}
    for entries in steps.values():
        for entry in entries:
            batch = UUID(entry["batch"])
            named[batch] = named.get(batch, 0) + 1
    succeeded = [i for i in accepted if i in by_id and by_id[i]["state"] == "succeeded"]
    failed = [i for i in accepted if i in by_id and by_id[i]["state"] == "failed"]
    overcounted = sum(max(0, n - batches[b]["tasks"]) for b, n in named.items() if b in batches)
    unrecorded = [b for b in named if b not in batches]
    if unrecorded:
        raise RuntimeError(f"tasks name batches that were never recorded: {unrecorded[:5]}")
    wrong = await _wrong_outputs(
        [
            # The input its client sent, not the one stored: a task must run what was asked.
            ([sample_input(accepted[i])], json.loads(by_id[i]["output"]), batches[b]["items"])
            for i in succeeded
            for b in [UUID(steps[i][-1]["batch"])]
        ]
    )
    return {
        "lost": len(accepted) - len(succeeded),
        "duplicated": sum(len(entries) > 1 for entries in steps.values()) + overcounted,
        "retried": sum(row["tries"] > 1 for i, row in by_id.items() if i in accepted),
        "failed": len(failed),
        "wrong_outputs": wrong,
        "tasks": len(accepted),
        "unacknowledged": len([i for i in by_id if i not in accepted]),
        "fenced_results": sum(max(0, row["tasks"] - named.get(b, 0)) for b, row in batches.items()),
        "in_flight_at_kill": kills,
        "finished_s": finish_s,
    }


async def _wrong_outputs(results: list[tuple[list[Any], list[Any], int]]) -> int:
    """How many (inputs, outputs, batch size) are not exactly what the MLP computes here for
    that input in a batch of that size: in a process of its own that sees no GPU, as the
    replicas (given none) do, with MLP_SOURCE's own settings (one torch thread, the seeded
    weights)."""
    asked = [(item, size) for [item], _, size in results]
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", _REFERENCE, MLP_SOURCE),
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    answered, _ = await process.communicate(json.dumps(asked).encode())
    if process.returncode != 0:
        raise RuntimeError(f"the reference MLP failed (exit {process.returncode})")
    expected: list[list[float]] = json.loads(answered)
    return sum(
        outputs != [logits] for (_, outputs, _), logits in zip(results, expected, strict=True)
    )


_REFERENCE = """\
import json, sys
namespace = {}
exec(compile(sys.argv[1], "mlp.py", "exec"), namespace)
asked = json.load(sys.stdin)
json.dump([namespace["predict"]([item] * size)[0] for item, size in asked], sys.stdout)
"""
"""The MLP's logits for each (item, batch size) read as JSON from stdin, as JSON on stdout."""


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
