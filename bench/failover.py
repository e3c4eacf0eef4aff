"""`trainyard bench failover`: what a database failover costs Trainyard, with real parts: a
replicated Postgres run by Patroni and etcd (`harness.ha`: a primary and a synchronous standby),
a control plane process (`trainyard serve`) and a node agent (`trainyard agent`, process
runtime) given the multi-host URL, learners running, jobs being submitted, a job's log being
streamed over SSE, predictions sent to a deployment of a PyTorch model (`bench.serving_model`'s
MLP: synchronous ones, and asynchronous ones read back afterwards) and an inference job's
queries running on a replica of their own; then the primary's postmaster is killed with
SIGKILL, Patroni promotes the standby, and the old primary comes back as the new one's
synchronous standby.

Figures (docs/failover.md shows a run):

- acknowledged_lost: submissions answered 2xx whose job is not in the log afterwards (must be 0:
  a commit is acknowledged only once the standby has it).
- duplicated: submissions in the log more than once (0: a submission whose answer was lost is
  retried with its Idempotency-Key until it is answered), and log lines streamed twice.
- api_unavailable_s: from the first submission that failed after the kill to the first one
  answered 2xx after it (the HTTP API's outage as its clients see it).
- claims_resumed_s: from the kill to the first claim (a JobDeploying event) recorded after it.
- log_gap: events a follower of the global log (reading through the failover, resumed from its
  last position) did not see, lines missing from the streamed log, and projections that differ
  from a rebuild from position zero (0 each: the log stays gap-free).
- running_jobs_restarted: jobs that were running at the kill and were restarted, or whose
  learner is no longer the same process (0: learners keep running through a failover).
- lease_lost: nodes declared LOST during the run (0: a node's lease survives the database
  moving).
- failover_s: from the kill until Patroni reports a new leader; standby_back_s: until the old
  primary has come back as its synchronous standby.
- predictions_acknowledged: predictions answered 200 with their outputs (synchronous) or 202
  (asynchronous, and synchronous ones whose result took longer than the server's wait), each
  sent with an Idempotency-Key of its own and retried with it until answered.
- predictions_lost: of those, the ones whose task is not recorded afterwards as succeeded (an
  answered one: with the very outputs it was answered with) once every task has had the time
  to finish (must be 0).
- predictions_duplicated: results recorded more than once for one task (more than one entry
  in its `step_times`), plus tasks that the deployment's batches count beyond the tasks that
  succeeded (0: a result is produced once, fenced by its claim).
- predict_unavailable_s: as api_unavailable_s, for synchronous predictions.
- inference_queries_lost: of the queries the inference job had started at the end (numbers 0
  to its count of them), those not recorded as succeeded once they have had the time to
  finish, or with no row at all (0). inference_queries_retried: queries run more than once (a
  try lost with the database, for example). inference_queries_after_kill: queries finished after the
  kill, and inference_resumed_s: from the kill to the first of them.
- replicas_restarted: the deployment's replica and the inference job's replica that were
  restarted, or whose learner or model process (`runners.serve`) is no longer the same (0);
  inference_jobs_interrupted: the inference job not PROCESSING at the end, or restarted (0).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import aiohttp
import asyncpg

from bench.serving_model import MLP_ENTRY_POINT, mlp_artifact, sample_input
from controlplane.agents.events import NodeLost
from controlplane.composition import projection_runner
from controlplane.database import CONNECTION_ERRORS, create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.records import ORIGIN, LogPosition
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener, follow
from controlplane.inference.service import deployment_name
from controlplane.jobs.events import JobDeploying, JobSubmitted
from controlplane.jobs.images import DEFAULT_IMAGES
from controlplane.jobs.lifecycle import JobStatus
from controlplane.projections.runner import ProjectionRunner
from harness.ha import HaCluster, ha_cluster
from harness.processes import Cluster, cluster, counter, replica_process, until
from trainyard.api import ApiClient, sse_messages

LEASE_TTL_S = 10.0
HEARTBEAT_S = 0.5
SUBMIT_TIMEOUT = aiohttp.ClientTimeout(total=10)
PREDICT_TIMEOUT = aiohttp.ClientTimeout(total=30)
"""Above the server's synchronous wait (20 s), after which it answers 202."""
RETRY_S = 0.1
"""How soon a failed submission is tried again: the resolution of api_unavailable_s."""
WAIT_S = 120.0
"""A bound on how long a broken recovery may hang, never an expectation of how fast it is."""
MODEL = "failover-mlp"
PREDICT_INTERVAL_S = 0.2
ASYNC_INTERVAL_S = 0.5
INFERENCE_BATCH = 4
SERVING = {"max_batch_size": 4, "max_wait_ms": 2, "memo": False}
REPLICA = {"cpus": 0.5, "memory_mb": 1024}
"""What each replica (the deployment's, the inference job's) and the long job hold: beside
them, the node's CPUs (the machine's, two in CI) keep room for the jobs submitted meanwhile,
whose claims are measured."""

Say = Callable[[str], None]


@dataclass
class Submitter:
    """Submits a short job every `interval_s`, each with an Idempotency-Key of its own; a
    submission that fails (no answer, or 5xx) is tried again with the same key until it is
    answered 2xx."""

    server: str
    token: str
    interval_s: float
    acknowledged: dict[str, UUID] = field(default_factory=dict)
    """Idempotency key → the job the 2xx answer named."""
    failures: list[float] = field(default_factory=list)
    """`time.perf_counter()` of each failed try."""
    successes: list[float] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with aiohttp.ClientSession(headers=headers, timeout=SUBMIT_TIMEOUT) as session:
            number = 0
            while not stop.is_set():
                number += 1
                await self._submit(session, f"failover-{number}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)

    async def _submit(self, session: aiohttp.ClientSession, key: str) -> None:
        manifest = {
            "name": key,
            "image": DEFAULT_IMAGES,
            # A job that ends at once: what is measured is its way through the system.
            "command": [sys.executable, "-c", "print('done')"],
            "cpus": 0.1,
            "memory_mb": 256,
        }
        while True:
            try:
                async with session.post(
                    f"{self.server}/v1/jobs", json=manifest, headers={"Idempotency-Key": key}
                ) as response:
                    if response.status < 300:
                        self.acknowledged[key] = UUID((await response.json())["id"])
                        self.successes.append(time.perf_counter())
                        return
                    if response.status < 500:
                        raise RuntimeError(f"{key}: {response.status} {await response.text()}")
            except (aiohttp.ClientError, TimeoutError):
                pass  # no answer: it may or may not have committed, and the retry says which
            self.failures.append(time.perf_counter())
            await asyncio.sleep(RETRY_S)

    def outage(self, after: float) -> float:
        return _outage(self.failures, self.successes, after)


def _outage(failures: list[float], successes: list[float], after: float) -> float:
    """From the first failure after `after` to the first success after that failure."""
    failed = [t for t in failures if t >= after]
    if not failed:
        return 0.0
    return min(t for t in successes if t > failed[0]) - failed[0]


@dataclass
class Predictor:
    """Sends a prediction of one item (`sample_input`) to the deployment every `interval_s`,
    each with an Idempotency-Key of its own, synchronous (answered 200 with the outputs) or
    `asynchronous` (202 with the task); one that fails (no answer, or 5xx) is sent again with
    the same key until it is answered."""

    server: str
    token: str
    deployment: str
    interval_s: float
    asynchronous: bool
    answered: dict[str, tuple[UUID, list[Any] | None]] = field(default_factory=dict)
    """Idempotency key → the task the answer named, and the outputs for a 200 (None: 202)."""
    failures: list[float] = field(default_factory=list)
    successes: list[float] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        kind = "async" if self.asynchronous else "sync"
        async with aiohttp.ClientSession(headers=headers, timeout=PREDICT_TIMEOUT) as session:
            number = 0
            while not stop.is_set():
                number += 1
                await self._predict(session, f"failover-{kind}-{number}", number)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)

    async def _predict(self, session: aiohttp.ClientSession, key: str, seed: int) -> None:
        body = {"inputs": [sample_input(seed)], "async": self.asynchronous}
        url = f"{self.server}/v1/deployments/{self.deployment}/predict"
        while True:
            try:
                async with session.post(
                    url, json=body, headers={"Idempotency-Key": key}
                ) as response:
                    if response.status < 300:
                        task = await response.json()
                        outputs = task.get("outputs") if response.status == 200 else None
                        self.answered[key] = (UUID(task["task_id"]), outputs)
                        self.successes.append(time.perf_counter())
                        return
                    if response.status < 500:
                        raise RuntimeError(f"{key}: {response.status} {await response.text()}")
            except (aiohttp.ClientError, TimeoutError):
                pass  # no answer: it may or may not be queued, and the retry says which
            self.failures.append(time.perf_counter())
            await asyncio.sleep(RETRY_S)

    def outage(self, after: float) -> float:
        return _outage(self.failures, self.successes, after)


@dataclass
class LogStream:
    """A job's log over SSE (`follow=true`), resumed with Last-Event-ID whenever the stream
    ends or fails (a 503 while the control plane has no database included)."""

    server: str
    token: str
    job_id: UUID
    ids: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=30)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
            while not stop.is_set():
                resume = {"Last-Event-ID": str(self.ids[-1])} if self.ids else {}
                url = f"{self.server}/v1/jobs/{self.job_id}/logs"
                try:
                    async with session.get(
                        url, params={"follow": "true", "attempt": "1"}, headers=resume
                    ) as response:
                        if response.status == 200:
                            async for message in sse_messages(response.content):
                                self._take(message.id, message.data)
                                if stop.is_set():
                                    return
                except (aiohttp.ClientError, TimeoutError):
                    pass  # resumed below, from the last id seen
                await asyncio.sleep(RETRY_S)

    def _take(self, message_id: str | None, data: str) -> None:
        if message_id is None:
            return
        self.ids.append(int(message_id))
        line = json.loads(data)
        word, _, number = str(line["line"]).partition(" ")
        if line["stream"] == "stdout" and word == "step" and number.isdigit():
            self.steps.append(int(number))

    def faults(self) -> tuple[int, int]:
        """(lines missing, lines repeated) in what was streamed."""
        repeated = len(self.ids) - len(set(self.ids)) + len(self.steps) - len(set(self.steps))
        missing = (max(self.steps) - len(set(self.steps))) if self.steps else 0
        return missing, repeated


class LogFollower:
    """Reads the global log as projections and SSE do (`follow`), through the failover: on a
    lost connection it resumes from the last position it read."""

    def __init__(self, url: str, store: EventStore) -> None:
        self.listener = LogListener(url)
        self._store = store
        self.seen: list[int] = []
        self.position: LogPosition = ORIGIN

    async def run(self) -> None:
        """Until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.listener.run())
            try:
                while True:
                    try:
                        async for event in follow(self._store, self.listener, self.position):
                            self.seen.append(event.position)
                            self.position = event.log_position
                    except CONNECTION_ERRORS:
                        await asyncio.sleep(RETRY_S)
            finally:
                self.listener.stop()
                self.listener.wake()

    async def missed(self) -> int:
        """Once nothing appends any more: the events of the whole log it has not read (after
        a bounded wait for it to read them)."""
        every = await _positions(self._store)

        async def read_all() -> bool | None:
            return True if every <= set(self.seen) else None

        with contextlib.suppress(TimeoutError):
            await until(read_all)
        return len(every - set(self.seen))


async def _positions(store: EventStore) -> set[int]:
    positions: set[int] = set()
    after = ORIGIN
    while events := await store.read_log(after, 1000):
        positions.update(e.position for e in events)
        after = events[-1].log_position
    return positions


async def run(
    *,
    submit_interval_s: float = 1.0,
    running_jobs: int = 1,
    before_s: float = 3.0,
    after_s: float = 5.0,
    progress: bool = False,
) -> dict[str, Any]:
    """One failover under load; the figures (see the module's docstring)."""

    def say(what: str) -> None:
        if progress:
            print(f"failover: {what}", file=sys.stderr, flush=True)

    say("starting etcd and two Patroni-run Postgres servers")
    async with ha_cluster() as ha:
        url = ha.url()
        pool = await create_pool(url, min_size=1, max_size=5)
        try:
            store = EventStore(pool, EVENT_REGISTRY)
            follower = LogFollower(url, store)
            with tempfile.TemporaryDirectory(prefix="trainyard-failover-") as root:
                # Passable by learners that run as users of their own (the agents are root).
                os.chmod(root, 0o711)
                async with asyncio.TaskGroup() as group:
                    following = group.create_task(follower.run())
                    async with cluster(url, Path(root), pool) as running:
                        load = Load(submit_interval_s, running_jobs, before_s, after_s)
                        figures = await _fail_over(ha, running, load, say)
                    # Everything stopped: nothing appends now.
                    say("checking the log and the projections")
                    figures["log_gap"] += await follower.missed()
                    following.cancel()
            figures["log_gap"] += len(await _differing_projections(pool, url))
            figures |= await _in_log(pool, figures.pop("acknowledged"), figures.pop("killed_at"))
            figures["events_followed"] = len(follower.seen)
            return figures
        finally:
            await pool.close()


@dataclass(frozen=True)
class Load:
    submit_interval_s: float
    running_jobs: int
    before_s: float
    after_s: float


async def _fail_over(ha: HaCluster, running: Cluster, load: Load, say: Say) -> dict[str, Any]:
    plane = await running.add_plane()
    await running.add_agent(ttl_s=LEASE_TTL_S, heartbeat_s=HEARTBEAT_S)
    say(f"starting {load.running_jobs} long-running jobs")
    long_jobs = [
        await running.submit({**counter(steps=1_000_000, step_s=0.1), **REPLICA}, plane)
        for _ in range(load.running_jobs)
    ]
    for job_id in long_jobs:
        await running.until_job(job_id, lambda job: job.state is JobStatus.PROCESSING)
    learners = {job_id: (await running.learner(job_id, 1)).handle for job_id in long_jobs}
    serving = await _start_serving(running, plane.url, say)
    submitter = Submitter(plane.url, running.token, load.submit_interval_s)
    stream = LogStream(plane.url, running.token, long_jobs[0])
    predictor = Predictor(plane.url, running.token, MODEL, PREDICT_INTERVAL_S, False)
    queuer = Predictor(plane.url, running.token, MODEL, ASYNC_INTERVAL_S, True)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(submitter.run(stop))
        group.create_task(stream.run(stop))
        group.create_task(predictor.run(stop))
        group.create_task(queuer.run(stop))

        async def streaming() -> bool | None:
            return True if stream.steps else None

        # The learners' start (imports) can take seconds on a loaded machine.
        await until(streaming)
        await asyncio.sleep(load.before_s)
        say("killing the primary's postmaster (kill -9)")
        old = await ha.kill_primary_postgres()
        killed, killed_at = time.perf_counter(), datetime.now(UTC)
        await ha.until_new_leader(old)
        failover_s = time.perf_counter() - killed
        say(f"a new leader after {failover_s:.1f}s; waiting for the old primary to follow it")
        await ha.until_failed_over(old)
        standby_back_s = time.perf_counter() - killed
        streamed = len(stream.steps)

        waiting = ["a submission answered", "a log line streamed", "a prediction answered"]

        async def resumed() -> bool | None:
            """Once a submission was answered, a log line streamed and a prediction answered,
            each after the kill; `waiting` names what is not yet. (Claims and inference
            queries are read from the database afterwards: a run where none resumed still
            reports its other figures.)"""
            if submitter.successes and submitter.successes[-1] > killed:
                waiting[:] = [w for w in waiting if w != "a submission answered"]
            if len(stream.steps) > streamed:
                waiting[:] = [w for w in waiting if w != "a log line streamed"]
            if predictor.successes and predictor.successes[-1] > killed:
                waiting[:] = [w for w in waiting if w != "a prediction answered"]
            return None if waiting else True

        say("waiting for submissions and the log stream to resume")
        try:
            await until(resumed)
        except TimeoutError:
            raise RuntimeError(f"still waiting for {' and '.join(waiting)}") from None
        await asyncio.sleep(load.after_s)
        stop.set()
    restarted = 0
    for job_id, handle in learners.items():
        job = await running.job(job_id)
        alive = [f.handle for f in running.learners(job_id) if f.attempt == 1]
        if job.attempt != 1 or job.state is not JobStatus.PROCESSING or alive != [handle]:
            restarted += 1
    missing, repeated = stream.faults()
    say("waiting for every prediction and inference query under way to finish")
    served = await _served(running, serving, {**predictor.answered, **queuer.answered}, killed_at)
    return {
        "acknowledged": submitter.acknowledged,
        "killed_at": killed_at,
        "submissions_acknowledged": len(submitter.acknowledged),
        "api_unavailable_s": round(submitter.outage(killed), 3),
        "failover_s": round(failover_s, 3),
        "standby_back_s": round(standby_back_s, 3),
        "running_jobs_restarted": restarted,
        "log_lines_streamed": len(stream.ids),
        "log_gap": missing,
        "duplicated": repeated,
        "predict_unavailable_s": round(predictor.outage(killed), 3),
        **served,
    }


@dataclass(frozen=True)
class Serving:
    """The deployment and the inference job that run through the failover."""

    inference_job: UUID
    replicas: dict[UUID, tuple[str, int]]
    """Each replica job (the deployment's, the inference job's) → its learner's handle and the
    pid of its model process (`runners.serve`), before the kill."""


async def _start_serving(running: Cluster, server: str, say: Say) -> Serving:
    """MODEL published, deployed on one replica and answering, and an endless inference job
    on it whose first query has finished."""
    say("publishing the MLP, deploying it and starting an inference job on it")
    async with ApiClient(server, running.token) as client:
        metadata = {
            "title": "trainyard bench failover: an MLP",
            "creators": [{"name": "trainyard bench"}],
            "framework": "pytorch",
            "servable": {
                "entry_point": MLP_ENTRY_POINT,
                "input": {"type": "list"},
                "output": {"type": "list"},
            },
        }
        form = aiohttp.MultipartWriter("form-data")
        part = form.append_json({"metadata": metadata})
        part.set_content_disposition("form-data", name="publication")
        part = form.append(mlp_artifact())
        part.set_content_disposition("form-data", name="artifact", filename="model.zip")
        await client.request("POST", f"/v1/models/{MODEL}/versions", form=form)
        deployment = {"name": MODEL, "model": MODEL, "replicas": 1}
        await client.request(
            "POST", "/v1/deployments", body={**deployment, "resources": REPLICA, "serving": SERVING}
        )
        inference = {
            "name": "failover-queries",
            "model": MODEL,
            "input": {"generate": {"shape": [len(sample_input())], "seed": 7}},
            "batch_size": INFERENCE_BATCH,
            "replicas": 1,
            "resources": REPLICA,
        }
        job = UUID((await client.request("POST", "/v1/inference", body=inference))["id"])
        # Once a synchronous prediction is answered, the replica has loaded the model (until
        # then, one is answered 202 after the server's wait, and its task runs later).
        async with asyncio.timeout(WAIT_S):
            while "outputs" not in await client.request(
                "POST", f"/v1/deployments/{MODEL}/predict", body={"inputs": [sample_input()]}
            ):
                pass

        async def queried() -> bool | None:
            found = await running.pool.fetchval(
                "SELECT true FROM inference_queries WHERE job_id = $1 AND state = 'succeeded' "
                "LIMIT 1",
                job,
            )
            return True if found else None

        await until(queried)
        [agent] = running.agents.values()
        replicas = {}
        for name in (MODEL, deployment_name(job)):
            view = await client.request("GET", f"/v1/deployments/{name}")
            for replica in view["replica_jobs"]:
                job_id = UUID(replica["job_id"])
                handle = (await running.learner(job_id, 1)).handle
                replicas[job_id] = (handle, replica_process(agent.name, agent.work_dir, job_id))
    return Serving(job, replicas)


async def _served(
    running: Cluster,
    serving: Serving,
    answered: dict[str, tuple[UUID, list[Any] | None]],
    killed_at: datetime,
) -> dict[str, Any]:
    """The serving figures, once every task of the deployment and every query the inference
    job started so far has finished (or WAIT_S passed: those unfinished count as lost)."""
    pool = running.pool
    # The queries started so far are those numbered below the job's count of them, which the
    # claim that makes a query raises in its own transaction. (Not those whose started_at is
    # before now(): a claim's now() is when its transaction began, perhaps before this one,
    # while it commits after.)
    started: int = await pool.fetchval(
        "SELECT started FROM inference_jobs WHERE job_id = $1", serving.inference_job
    )

    async def settled() -> bool | None:
        unfinished = await pool.fetchval(
            "SELECT (SELECT count(*) FROM serving_tasks WHERE deployment = $1"
            "        AND state IN ('queued', 'running'))"
            "     + (SELECT count(*) FROM inference_queries WHERE job_id = $2"
            "        AND index < $3 AND finished_at IS NULL)",
            MODEL,
            serving.inference_job,
            started,
        )
        return True if unfinished == 0 else None

    with contextlib.suppress(TimeoutError):
        await until(settled)
    rows = {
        row["task_id"]: row
        for row in await pool.fetch(
            "SELECT task_id, state, output FROM serving_tasks WHERE task_id = ANY($1::uuid[])",
            [task_id for task_id, _ in answered.values()],
        )
    }
    lost = 0
    for task_id, outputs in answered.values():
        row = rows.get(task_id)
        if row is None or row["state"] != "succeeded":
            lost += 1
        elif outputs is not None and json.loads(row["output"]) != outputs:
            lost += 1  # answered with outputs that are not the ones recorded
    duplicated = await pool.fetchval(
        "SELECT (SELECT coalesce(sum(greatest(jsonb_array_length(step_times) - 1, 0)), 0)"
        "        FROM serving_tasks WHERE deployment = $1)"
        "     + greatest((SELECT coalesce(sum(tasks), 0) FROM serving_batches"
        "                 WHERE deployment = $1 AND outcome = 'succeeded')"
        "                - (SELECT count(*) FROM serving_tasks"
        "                   WHERE deployment = $1 AND state = 'succeeded'), 0)",
        MODEL,
    )
    queries = await pool.fetchrow(
        "SELECT $2 - count(*) FILTER (WHERE index < $2 AND state = 'succeeded') AS lost,"
        "       count(*) FILTER (WHERE index < $2 AND tries > 1) AS retried,"
        "       count(*) FILTER (WHERE finished_at > $3) AS after_kill,"
        "       min(finished_at) FILTER (WHERE finished_at > $3) AS first_after_kill"
        " FROM inference_queries WHERE job_id = $1",
        serving.inference_job,
        started,
        killed_at,
    )
    if queries is None:
        raise RuntimeError("an aggregate answered no row")
    first: datetime | None = queries["first_after_kill"]
    job = await running.job(serving.inference_job)
    return {
        "predictions_acknowledged": len(answered),
        "predictions_answered": sum(outputs is not None for _, outputs in answered.values()),
        "predictions_lost": lost,
        "predictions_duplicated": duplicated,
        "inference_queries_lost": queries["lost"],
        "inference_queries_retried": queries["retried"],
        "inference_queries_after_kill": queries["after_kill"],
        "inference_resumed_s": None
        if first is None
        else round((first - killed_at).total_seconds(), 3),
        "replicas_restarted": await _replicas_restarted(running, serving),
        "inference_jobs_interrupted": int(
            job.state is not JobStatus.PROCESSING or job.attempt != 1
        ),
    }


async def _replicas_restarted(running: Cluster, serving: Serving) -> int:
    """The replicas restarted, or whose learner or model process is not the one before."""
    [agent] = running.agents.values()
    restarted = 0
    for job_id, (handle, pid) in serving.replicas.items():
        job = await running.job(job_id)
        alive = [f.handle for f in running.learners(job_id) if f.attempt == 1]
        try:
            process: int | None = replica_process(agent.name, agent.work_dir, job_id)
        except ValueError:  # no such process, or more than one
            process = None
        same = alive == [handle] and process == pid
        if job.attempt != 1 or job.state is not JobStatus.PROCESSING or not same:
            restarted += 1
    return restarted


async def _in_log(
    pool: asyncpg.Pool, acknowledged: dict[str, UUID], killed_at: datetime
) -> dict[str, Any]:
    """What the log says afterwards of the submissions, the claims and the nodes."""
    submitted: dict[str, list[UUID]] = {}
    for row in await pool.fetch(
        "SELECT data->'manifest'->>'name' AS name, (data->>'job_id')::uuid AS job_id "
        "FROM events WHERE type = $1",
        JobSubmitted.__name__,
    ):
        submitted.setdefault(row["name"], []).append(row["job_id"])
    lost = sum(job_id not in submitted.get(key, []) for key, job_id in acknowledged.items())
    duplicated = sum(len(jobs) - 1 for key, jobs in submitted.items() if key in acknowledged)
    first_claim = await pool.fetchval(
        "SELECT min(recorded_at) FROM events WHERE type = $1 AND recorded_at > $2",
        JobDeploying.__name__,
        killed_at,
    )
    return {
        "acknowledged_lost": lost,
        "duplicated_submissions": duplicated,
        "claims_resumed_s": round((first_claim - killed_at).total_seconds(), 3)
        if first_claim is not None
        else None,
        "lease_lost": await pool.fetchval(
            "SELECT count(*) FROM events WHERE type = $1", NodeLost.__name__
        ),
    }


async def _differing_projections(pool: asyncpg.Pool, url: str) -> list[str]:
    """The projections whose tables, caught up, differ from a rebuild from position zero."""
    runner: ProjectionRunner = projection_runner(
        pool, EventStore(pool, EVENT_REGISTRY), LogListener(url)
    )
    differing = []
    for name, projection in runner.projections.items():
        if not projection.tables:
            continue  # an outbox: nothing to rebuild
        await runner.catch_up(projection)
        before = await _rows(pool, projection.tables)
        await runner.rebuild(name)
        if await _rows(pool, projection.tables) != before:
            differing.append(name)
    return differing


async def _rows(pool: asyncpg.Pool, tables: Sequence[str]) -> list[list[str]]:
    # Table names come from the projections' code, never from input.
    return [
        sorted(repr(tuple(row)) for row in await pool.fetch(f'SELECT * FROM "{table}"'))
        for table in tables
    ]
