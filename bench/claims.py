"""`trainyard bench claims`: how fast agents take work from a deep queue, how soon a submitted
job runs, how fast a learner's log lines are stored, and the queue's work against `procrastinate`.

- claims: AGENTS concurrent agents (one task per registered fake node) claim from a queue of
  QUEUE_DEPTH one-GPU jobs until `seconds` pass or the queue is empty, while the projections
  that the queue reads (`jobs`, `tenants`) run as the control plane runs them: in a process of
  their own (`bench.projector`), not on the agents' event loop. Each agent holds
  HELD claims and releases the oldest as it takes a new one, so GPUs are really allocated and
  freed but a node (NODE_GPUS) never fills up. double_claims: jobs with more than one
  JobDeploying event in the log, plus GPUs allocated again while an earlier allocation of them
  was live (from `allocations`).
- latency: one real agent (process runtime, fake GPUs, default poll interval) and the control
  plane's projections in-process; LATENCY_JOBS no-op jobs submitted at LATENCY_RATE per second,
  each timed from just before its submit to the recorded time of its JobProcessing event, and
  split into: until the queue (a projection) holds it, until its claim is recorded, and until
  its learner reported PROCESSING.
- logs: `bench.logs` (one learner's lines stored through `write_lines`).
- peer: PEER_JOBS no-op jobs through each queue, in the same scratch database, in alternating
  rounds, with CONCURRENCY clients and then CONCURRENCY workers on each side (and Trainyard's
  queue projections running in their own process, as in the claims part; procrastinate keeps
  its own records with triggers, inside Postgres). Both sides count the time to enqueue every
  job (Trainyard: `Jobs.submit`, and until the queue projection holds them all;
  procrastinate: `defer_async`), then the time to take and finish each (Trainyard: `claim`,
  which takes as many as fit on the node, up to 8; for each, one append of JobProcessing +
  JobCompleted and `release`, an agent's appends and releases made at once going together;
  procrastinate: a worker's fetch, the no-op task and its finish). Trainyard's clients and
  agents share the benchmark's process and event loop, as procrastinate's clients and
  workers do.

Each part runs in a scratch database on the configured server, dropped at the end; `parts`
picks some of them (the peer's package is imported only when its part runs).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4

import asyncpg

from bench.logs import run as run_logs
from bench.projector import projector
from bench.scratch import scratch_database
from controlplane.agents.claims import Releases, claim
from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import Nodes, NodeSpec
from controlplane.clock import SYSTEM_CLOCK
from controlplane.composition import projections
from controlplane.database import create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.records import ORIGIN, LogPosition
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.events import JobCompleted, JobDeploying, JobFailed, JobProcessing
from controlplane.jobs.lifecycle import Complete, EnterPhase, JobStatus, Submit, decide, evolve
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.projection import JobsProjection
from controlplane.jobs.service import Jobs
from controlplane.jobs.streams import job_stream
from controlplane.projections.base import Projection
from controlplane.projections.runner import ProjectionRunner
from controlplane.scheduling.claim import Claim
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import create_tenant
from harness.served import until_registered
from node_agent.agent import AgentConfig
from node_agent.service import run_agent

if TYPE_CHECKING:
    from procrastinate import App
    from procrastinate.tasks import Task

AGENTS = 8
QUEUE_DEPTH = 10_000
SUBMIT_BATCH = 500
NODE_GPUS = 8
HELD = 4
LATENCY_JOBS = 50
# One job a second: each has run (about 0.4s) before the next comes, as on a cluster where
# training jobs are submitted now and then. Faster, the events of the jobs before wake the agent
# and hide how long it waits for its own wake-up.
LATENCY_RATE = 1.0
TARGET_P99_MS = 1000
QUEUE_PROBE_S = 0.005
WAIT_S = 60.0
PEER_JOBS = 2000
ROUNDS = 2
CONCURRENCY = 8
TARGET_RATIO = 2.0

TENANT = "bench"
USER = Metadata(actor="bench", tenant=TENANT)
ONE_GPU = JobManifest.model_validate(
    {"name": "bench", "image": "img", "command": ["train"], "gpus_per_learner": 1}
)
NO_OP = JobManifest.model_validate(
    {"name": "bench", "image": "img", "command": [sys.executable, "-c", "pass"]}
)

Say = Callable[[str], None]
PARTS = ("claims", "latency", "logs", "peer")


async def run(
    url: str, *, seconds: float, parts: Collection[str] = PARTS, progress: bool = False
) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr)

    result: dict[str, Any] = {}
    if "claims" in parts:
        async with scratch_database(url, "claims") as scratch:
            result |= await _claims(scratch, seconds, say)
    if "latency" in parts:
        async with scratch_database(url, "latency") as scratch:
            result |= await _latency(scratch, say)
    if "logs" in parts:
        say(f"logs: one learner's lines for {seconds:g}s ...")
        logs = await run_logs(url, seconds=seconds)
        result["log_lines_per_s"] = logs["log_lines_per_s"]
    if "peer" in parts:
        async with scratch_database(url, "queues") as scratch:
            result |= await _versus_peer(scratch, say)
    return result


class Plane:
    """The control plane's projections, a job service and nodes on one pool, in-process."""

    def __init__(self, url: str, projections: Sequence[Projection], pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.store = EventStore(pool, EVENT_REGISTRY)
        self.jobs = Jobs(self.store)
        self.nodes = Nodes(pool, self.store)
        # The control plane's own (default) poll interval.
        self.listener = LogListener(url)
        self.runner = ProjectionRunner(pool, self.store, self.listener, projections)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Run the projections in the background, as `trainyard serve` does."""
        self._tasks = [
            asyncio.create_task(self.listener.run()),
            asyncio.create_task(self.runner.run()),
        ]

    async def stop(self) -> None:
        self.runner.stop()
        self.listener.stop()
        self.listener.wake()
        await asyncio.gather(*self._tasks)

    async def node(self, name: str) -> None:
        gpus = [
            GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model="fake", memory_mb=80_000, healthy=True)
            for i in range(NODE_GPUS)
        ]
        await self.nodes.register(NodeSpec(name, uuid4(), "process", 64, 1 << 20, gpus), 3600)


@asynccontextmanager
async def opened_plane(
    url: str, projections: Sequence[Projection], pool_size: int
) -> AsyncIterator[Plane]:
    """A plane with the bench's tenant; its projections not yet running."""
    pool = await create_pool(url, min_size=pool_size, max_size=pool_size)
    plane = Plane(url, projections, pool)
    try:
        await create_tenant(plane.store, plane.runner, TENANT, actor="bench")
        yield plane
    finally:
        await plane.stop()
        await plane.store.close()
        await pool.close()


def _nodes() -> list[str]:
    return [f"bench-{i}" for i in range(AGENTS)]


# Claims from a deep queue.


async def _claims(url: str, seconds: float, say: Say) -> dict[str, Any]:
    async with opened_plane(url, [JobsProjection(), TenantsProjection()], AGENTS + 4) as plane:
        for name in _nodes():
            await plane.node(name)
        say(f"claims: queueing {QUEUE_DEPTH} jobs ...")
        batches = [submit_batch(plane, SUBMIT_BATCH) for _ in range(QUEUE_DEPTH // SUBMIT_BATCH)]
        last = max(await asyncio.gather(*batches))
        # Applied before the clock starts: only the claims are timed.
        for projection in plane.runner.projections.values():
            await plane.runner.catch_up(projection)
        await plane.runner.wait_applied(JobsProjection.name, last)
        say(f"claims: {AGENTS} agents for {seconds:g}s ...")
        won: list[Claim] = []
        deadline = time.perf_counter() + seconds

        async def agent(node: str) -> None:
            releases = Releases(plane.pool, node)
            held: deque[Claim] = deque()
            while time.perf_counter() < deadline:
                taken = await claim(plane.pool, plane.store, node)
                if not taken:
                    return  # the queue is empty, or its last jobs are being claimed by others
                won.extend(taken)
                held.extend(taken)
                while len(held) > HELD:
                    oldest = held.popleft()
                    await releases.release(oldest.job.job_id, oldest.attempt)

        async with projector(url):
            start = time.perf_counter()
            await asyncio.gather(*(agent(name) for name in _nodes()))
            elapsed = time.perf_counter() - start
        double = await _double_claims(plane.pool, len(won))
    return {
        "agents": AGENTS,
        "queue_depth": QUEUE_DEPTH,
        "seconds": seconds,
        "claims": len(won),
        "claims_per_s": round(len(won) / elapsed, 1),
        "double_claims": double,
    }


async def submit_batch(plane: Plane, count: int, tenant: str = TENANT) -> LogPosition:
    """Submit `count` one-GPU jobs of `tenant` in one transaction; the log position of the
    last."""
    last = ORIGIN
    metadata = Metadata(actor="bench", tenant=tenant)
    async with plane.pool.acquire() as conn, conn.transaction():
        for _ in range(count):
            job_id = uuid4()
            events = decide(Submit(job_id, tenant, ONE_GPU, SYSTEM_CLOCK.now()), None)
            appended = await plane.store.append(job_stream(job_id), 0, events, metadata, conn=conn)
            last = appended.log_position
    return last


JOBS_DEPLOYED_TWICE = """
SELECT count(*) FROM (
    SELECT stream_id FROM events WHERE type = $1 GROUP BY stream_id HAVING count(*) > 1
) twice
"""
# Each node's claims come from one agent, which releases before it claims again: so every
# allocation of a GPU must have been released before its next allocation began.
GPUS_ALLOCATED_WHILE_LIVE = """
SELECT count(*) FROM (
    SELECT allocated_at,
           lag(released_at) OVER w AS previous_released_at,
           row_number() OVER w AS n
    FROM allocations, unnest(gpus) AS gpu
    WINDOW w AS (PARTITION BY gpu ORDER BY epoch, learner)
) reused
WHERE n > 1 AND (previous_released_at IS NULL OR previous_released_at > allocated_at)
"""


async def _double_claims(pool: asyncpg.Pool, claims: int) -> int:
    deploying = JobDeploying.type_name
    recorded = await pool.fetchval("SELECT count(*) FROM events WHERE type = $1", deploying)
    if recorded != claims:
        raise AssertionError(f"{claims} claims returned, but {recorded} JobDeploying events")
    jobs = await pool.fetchval(JOBS_DEPLOYED_TWICE, deploying)
    gpus = await pool.fetchval(GPUS_ALLOCATED_WHILE_LIVE)
    return int(jobs) + int(gpus)


# Submit-to-PROCESSING latency with a real agent.

SUBMIT = "submit"
QUEUED = "queued"
STAGES = (
    ("submit_to_processing", SUBMIT, JobProcessing.type_name),
    ("submit_to_queued", SUBMIT, QUEUED),
    ("queued_to_deploying", QUEUED, JobDeploying.type_name),
    ("deploying_to_processing", JobDeploying.type_name, JobProcessing.type_name),
)


@dataclass
class _Timeline:
    """When a job reached each point: just before its submit, when the queue was first seen
    holding it, and the recorded time of each of its events (by type)."""

    at: dict[str, datetime]

    def between(self, start: str, end: str) -> float:
        return (self.at[end] - self.at[start]).total_seconds()


async def _latency(url: str, say: Say) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work:
        config = AgentConfig(
            name="bench-agent",
            work_dir=Path(work),
            cpus=64,
            memory_mb=1 << 20,
            launcher=(sys.executable, "-m", "runners.launch"),
        )
        return await submit_latency(url, config, NO_OP, say)


async def submit_latency(
    url: str, config: AgentConfig, job: JobManifest, say: Say
) -> dict[str, Any]:
    """LATENCY_JOBS copies of `job` submitted steadily to one real agent (`config`, two fake
    GPUs) on the database at `url`: each stage's p50 and p99 (see the module's note)."""
    async with opened_plane(url, projections(), 6) as plane:
        plane.start()
        stop, registered = asyncio.Event(), asyncio.Event()
        agent = asyncio.create_task(
            run_agent(url, config, fake_gpus=2, stop=stop, registered=registered)
        )
        try:
            await until_registered(agent, registered)
            say(f"latency: {LATENCY_JOBS} jobs at {LATENCY_RATE:g}/s to one agent ...")
            timelines = await _submit_steadily(plane, job)
            await _until_completed(plane.pool, len(timelines))
        finally:
            stop.set()
            await asyncio.wait_for(agent, 30)
        for job_id, timeline in timelines.items():
            for recorded in await plane.store.read_stream(job_stream(job_id)):
                timeline.at[recorded.event.type_name] = recorded.recorded_at
    result: dict[str, Any] = {
        "latency_jobs": LATENCY_JOBS,
        "latency_rate_per_s": LATENCY_RATE,
        "target_p99_ms": TARGET_P99_MS,
    }
    for name, start, end in STAGES:
        durations = [timeline.between(start, end) for timeline in timelines.values()]
        result[f"{name}_p50_ms"] = ms(statistics.median(durations))
        result[f"{name}_p99_ms"] = ms(p99(durations))
    return result


async def _submit_steadily(plane: Plane, manifest: JobManifest) -> dict[UUID, _Timeline]:
    timelines: dict[UUID, _Timeline] = {}
    watchers: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    for i in range(LATENCY_JOBS):
        await asyncio.sleep(max(0.0, start + i / LATENCY_RATE - time.perf_counter()))
        before = datetime.now(UTC)
        job, _ = await plane.jobs.submit(TENANT, manifest, USER)
        timeline = timelines[job.job_id] = _Timeline({SUBMIT: before})
        watchers.append(asyncio.create_task(_watch_queue(plane.pool, job.job_id, timeline)))
    await asyncio.gather(*watchers)
    return timelines


async def _watch_queue(pool: asyncpg.Pool, job_id: UUID, timeline: _Timeline) -> None:
    """Note when the queue (the `jobs` projection) first holds the job."""

    async def queued() -> bool:
        return bool(await pool.fetchval("SELECT 1 FROM job_status WHERE job_id = $1", job_id))

    await _until(queued)
    timeline.at[QUEUED] = datetime.now(UTC)


async def _until_completed(pool: asyncpg.Pool, count: int) -> None:
    async def completed() -> bool:
        failure = await pool.fetchval(
            "SELECT data ->> 'reason' FROM events WHERE type = $1 LIMIT 1", JobFailed.type_name
        )
        if failure is not None:
            raise RuntimeError(f"a bench job failed: {failure}")
        done = await pool.fetchval(
            "SELECT count(*) FROM events WHERE type = $1", JobCompleted.type_name
        )
        return bool(done == count)

    await _until(completed)


async def _until(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll `check` until it holds; TimeoutError after WAIT_S."""
    async with asyncio.timeout(WAIT_S):
        while True:
            if await check():
                return
            await asyncio.sleep(QUEUE_PROBE_S)


# Against procrastinate.


@dataclass
class _Split:
    """Seconds spent enqueueing, and taking and finishing, over the rounds."""

    enqueue_s: float = 0.0
    work_s: float = 0.0

    def add(self, enqueue_s: float, work_s: float) -> None:
        self.enqueue_s += enqueue_s
        self.work_s += work_s

    def per_s(self) -> float:
        return PEER_JOBS / (self.enqueue_s + self.work_s)


async def _no_op() -> None:
    """The peer's job: nothing, like `python -c pass` once the queue has done its part."""


async def _versus_peer(url: str, say: Say) -> dict[str, Any]:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=url, min_size=CONCURRENCY + 2))
    task = app.task(name="bench_no_op")(_no_op)
    ours, theirs = _Split(), _Split()
    per_round = PEER_JOBS // ROUNDS
    async with (
        opened_plane(url, [JobsProjection(), TenantsProjection()], CONCURRENCY + 4) as plane,
        app.open_async(),
    ):
        await app.schema_manager.apply_schema_async()
        for name in _nodes():
            await plane.node(name)
        async with projector(url):
            # Alternating rounds, so that drift in the machine's load hits both alike.
            for round_ in range(1, ROUNDS + 1):
                say(f"peer: round {round_}/{ROUNDS}, {per_round} jobs through each queue ...")
                ours.add(*await _trainyard_round(plane, per_round * round_))
                theirs.add(*await _procrastinate_round(app, task, per_round, per_round * round_))
    return {
        "peer": f"procrastinate {version('procrastinate')}",
        "peer_jobs": PEER_JOBS,
        "peer_concurrency": CONCURRENCY,
        "jobs_per_s": round(ours.per_s(), 1),
        "enqueue_per_s": round(PEER_JOBS / ours.enqueue_s, 1),
        "claim_finish_per_s": round(PEER_JOBS / ours.work_s, 1),
        "peer_jobs_per_s": round(theirs.per_s(), 1),
        "peer_defer_per_s": round(PEER_JOBS / theirs.enqueue_s, 1),
        "peer_fetch_finish_per_s": round(PEER_JOBS / theirs.work_s, 1),
        "ratio_vs_peer": round(ours.per_s() / theirs.per_s(), 3),
        "target_ratio": TARGET_RATIO,
    }


async def _trainyard_round(plane: Plane, total: int) -> tuple[float, float]:
    """Submit jobs until `total` exist, then claim and finish them all; the two durations."""
    start = time.perf_counter()
    existing = await plane.pool.fetchval("SELECT count(*) FROM job_status")
    await _concurrently(total - existing, lambda: plane.jobs.submit(TENANT, ONE_GPU, USER))

    async def all_queued() -> bool:
        return bool(await plane.pool.fetchval("SELECT count(*) FROM job_status") == total)

    # A job can be claimed once the queue (a projection) holds it.
    await _until(all_queued)
    queued = time.perf_counter()
    finished = 0

    async def worker(node: str) -> None:
        nonlocal finished
        # An agent of its own: its appends and releases go together only with its own.
        store = EventStore(plane.pool, EVENT_REGISTRY)
        releases = Releases(plane.pool, node)
        metadata = Metadata(actor=f"agent:{node}", tenant=TENANT)

        async def finish(won: Claim) -> None:
            job = won.job
            events = decide(EnterPhase(JobStatus.PROCESSING, SYSTEM_CLOCK.now()), job)
            processing = evolve(job, events[0])
            events += decide(Complete([0] * len(won.learners), SYSTEM_CLOCK.now()), processing)
            await store.append(job_stream(job.job_id), won.version, events, metadata)
            await releases.release(job.job_id, won.attempt)

        while won := await claim(plane.pool, store, node):
            # The learners of the jobs claimed together run side by side, as on a node.
            await asyncio.gather(*(finish(taken) for taken in won))
            finished += len(won)
        await store.close()

    await asyncio.gather(*(worker(node) for node in _nodes()))
    if finished != total - existing:
        raise AssertionError(f"{finished} of {total - existing} jobs were claimed and finished")
    return queued - start, time.perf_counter() - queued


async def _procrastinate_round(
    app: App, task: Task[[], Coroutine[Any, Any, None], []], count: int, total: int
) -> tuple[float, float]:
    """Defer `count` jobs, then run workers until the queue is empty; the two durations."""
    start = time.perf_counter()
    await _concurrently(count, task.defer_async)
    deferred = time.perf_counter()
    await asyncio.gather(
        *(
            app.run_worker_async(
                name=f"bench-{i}",
                wait=False,  # stop once the queue is empty
                listen_notify=False,  # nothing is deferred while the workers run
                install_signal_handlers=False,
            )
            for i in range(CONCURRENCY)
        )
    )
    finished = time.perf_counter()
    row = await app.connector.execute_query_one_async(
        "SELECT count(*) AS n FROM procrastinate_jobs WHERE status = 'succeeded'"
    )
    if row["n"] != total:
        raise AssertionError(f"{row['n']} of {total} procrastinate jobs succeeded")
    return deferred - start, finished - deferred


async def _concurrently(count: int, call: Callable[[], Awaitable[object]]) -> None:
    """Await `call()` `count` times in all, from CONCURRENCY clients."""
    remaining = iter(range(count))

    async def client() -> None:
        for _ in remaining:
            await call()

    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]
