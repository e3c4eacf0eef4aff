"""The history that `trainyard bench scale` measures against: a database per size (10 k, 1 M and
10 M events), kept between runs, holding finished jobs of several tenants as a long-lived
cluster would: each job's ten events (submitted, deploying, downloading, processing, four
checkpoints, storing, completed) appended through the store's own batch append, its released
allocation, and two log lines. Then every projection replays the log from zero: that replay's
time is the size's `rebuild_s`, recorded with the fill.

A fill interrupted part-way resumes where its last batch committed: the log is the record of
how far it got, and the projections resume from their checkpoints (the rebuild time is then
not recorded, as no replay ran whole).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid5

import asyncpg

from controlplane.composition import projection_runner
from controlplane.database import connect, create_pool, with_database
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.records import StreamAppend
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.events import JobEvent
from controlplane.jobs.lifecycle import (
    Command,
    Complete,
    Deploy,
    EnterPhase,
    Job,
    JobStatus,
    SaveCheckpoint,
    Submit,
    decide,
    evolve,
)
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.streams import job_stream
from controlplane.migrate import migrate
from controlplane.projections.runner import ProjectionRunner
from controlplane.tenants.errors import TenantExists
from controlplane.tenants.service import create_tenant

SIZES = {"10k": 10_000, "1m": 1_000_000, "10m": 10_000_000}
"""The sizes of history measured, by label: events in the log before a run."""
TENANTS = tuple(f"scale-{i}" for i in range(8))
EVENTS_PER_JOB = 10
JOBS_PER_BATCH = 200
"""Jobs appended per statement (2,000 events): the store's batch append at its measured best."""
WRITERS = 2
"""Batches in flight: one is encoded while the other is in Postgres."""
NODES = 1000
NODE_GPUS = 8
GPU_MIX = (1, 1, 1, 1, 2, 2, 4, 8)
"""GPUs per learner, drawn: most jobs take one."""
HISTORY = timedelta(days=365)
"""Finished jobs are spread over the past year."""
TEAMS = ("vision", "speech", "nlp", "ranking")
NAMESPACE = UUID("5ca1ab1e-0000-4000-8000-000000000000")
"""Job ids are uuid5(NAMESPACE, "<size>/<n>"): a resumed fill writes the same jobs."""

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Filled:
    label: str
    name: str
    """The database's."""
    url: str
    events: int
    finished_jobs: int
    rebuild_s: float | None
    """Every projection's replay of the whole log, at the fill; None if it was interrupted."""
    fill_s: float
    """How long this call spent filling it: 0 for a database kept from an earlier run."""


PREFIX = "trainyard_scale"
GROWN = 1.5
"""A run appends some 50,000 events of its own (its queue, claims, reports, nodes): a size
whose log has grown past this much of its own is filled anew, so that each size measures the
history it is named for (the smallest, every run; 10 M, every hundred or so)."""


async def filled(url: str, label: str, say: Say, prefix: str = PREFIX) -> Filled:
    """The size's database (`<prefix>_<label>`) on the server of `url`, filled first if it is
    not yet, or anew once the runs' own events have grown it past GROWN of its size."""
    name = f"{prefix}_{label}"
    scale_url = with_database(url, name)
    started = time.perf_counter()
    admin = await connect(url, role=None)
    try:
        if await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            grown = await _events(scale_url)
            if grown > SIZES[label] * GROWN:
                say(f"scale {label}: runs have grown it to {grown:,} events; filling it anew")
                await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    await migrate(scale_url)
    row = await _fill_record(scale_url)
    if row is None:
        await _fill(scale_url, label, SIZES[label], say)
        row = await _fill_record(scale_url)
        if row is None:
            raise RuntimeError(f"scale {label}: the fill ended without its record")
    fill_s = time.perf_counter() - started
    return Filled(
        label, name, scale_url, row["events"], row["finished_jobs"], row["rebuild_s"], fill_s
    )


async def _events(url: str) -> int:
    owner = await connect(url, role=None)
    try:
        return int(await owner.fetchval("SELECT coalesce(max(position), 0) FROM events"))
    finally:
        await owner.close()


async def _fill_record(url: str) -> asyncpg.Record | None:
    owner = await connect(url, role=None)
    try:
        await owner.execute(FILL_TABLE)
        record: asyncpg.Record | None = await owner.fetchrow("SELECT * FROM bench_scale_fill")
        return record
    finally:
        await owner.close()


FILL_TABLE = """
CREATE TABLE IF NOT EXISTS bench_scale_fill (
    events        bigint NOT NULL,
    finished_jobs bigint NOT NULL,
    rebuild_s     double precision,
    filled_at     timestamptz NOT NULL DEFAULT now()
)
"""


async def _fill(url: str, label: str, target: int, say: Say) -> None:
    # As the owner: history is bulk-loaded with COPY, which row-level security (on allocations
    # and the log's counters, for agents' logins) refuses to the application's role.
    pool = await create_pool(url, min_size=3, max_size=3, role=None)
    store = EventStore(pool, EVENT_REGISTRY)
    listener = LogListener(url)
    runner = projection_runner(pool, store, listener)
    try:
        await _tenants(store, runner, listener)
        jobs = target // EVENTS_PER_JOB
        # Batches commit whole but not in order: a resumed fill goes back over the last few
        # (their jobs, already there, are refused by the append and skipped).
        appended = await pool.fetchval("SELECT count(*) FROM events WHERE stream_id LIKE 'job-%'")
        done = max(0, appended // EVENTS_PER_JOB - WRITERS * JOBS_PER_BATCH)
        say(f"scale {label}: appending {jobs - done:,} finished jobs ({target:,} events) ...")
        started = time.perf_counter()
        batches = iter(range(done, jobs, JOBS_PER_BATCH))

        async def writer() -> None:
            for first in batches:
                await _append_batch(
                    pool, store, label, range(first, min(first + JOBS_PER_BATCH, jobs)), jobs
                )
                if first % (JOBS_PER_BATCH * 250) == 0:
                    rate = (first - done) * EVENTS_PER_JOB / (time.perf_counter() - started)
                    say(f"scale {label}: {first:,} jobs, {rate:,.0f} events/s")

        async with asyncio.TaskGroup() as group:
            for _ in range(WRITERS):
                group.create_task(writer())
        say(f"scale {label}: appended in {time.perf_counter() - started:.0f}s; projections ...")
        # A replay from zero (no job projected yet) is a full rebuild's time.
        whole = not await pool.fetchval("SELECT EXISTS (SELECT 1 FROM job_status)")
        started = time.perf_counter()
        # A round stops early where a transaction elsewhere on the server holds the readable
        # bound back (see docs/architecture.md, "The event store"): rounds until nothing is left.
        while sum([await runner.catch_up(p) for p in runner.projections.values()]):
            pass
        replayed_s = time.perf_counter() - started
        say(f"scale {label}: projections replayed in {replayed_s:.0f}s")
        owner = await connect(url, role=None)
        try:
            # As autovacuum would have long since: visibility maps and statistics in place.
            await owner.execute("VACUUM ANALYZE")
            await owner.execute(
                "INSERT INTO bench_scale_fill (events, finished_jobs, rebuild_s) "
                "VALUES ((SELECT max(position) FROM events), "
                "(SELECT count(*) FROM job_status WHERE state = 'COMPLETED'), $1)",
                replayed_s if whole else None,
            )
        finally:
            await owner.close()
    finally:
        await store.close()
        await pool.close()


async def _tenants(store: EventStore, runner: ProjectionRunner, listener: LogListener) -> None:
    """Create the tenants that do not exist yet (each run issues them tokens of its own)."""
    tasks = [asyncio.create_task(listener.run()), asyncio.create_task(runner.run())]
    try:
        for tenant in TENANTS:
            with suppress(TenantExists):
                await create_tenant(store, runner, tenant, actor="bench")
    finally:
        runner.stop()
        listener.stop()
        listener.wake()
        await asyncio.gather(*tasks)


def _manifests() -> dict[tuple[str, int], JobManifest]:
    return {
        (team, gpus): JobManifest.model_validate(
            {
                "name": f"{team}-train",
                "image": "trainyard/learner:scale",
                "command": ["python", "train.py"],
                "gpus_per_learner": gpus,
                "labels": {"team": team},
            }
        )
        for team in TEAMS
        for gpus in GPU_MIX
    }


MANIFESTS = _manifests()


def finished_job_id(label: str, n: int) -> UUID:
    return uuid5(NAMESPACE, f"{label}/{n}")


@dataclass(frozen=True, slots=True)
class _Job:
    job_id: UUID
    tenant: str
    node: str
    gpus: list[str]
    epoch: int
    submitted: datetime
    ended: datetime
    events: list[JobEvent]


def _finished_job(label: str, n: int, jobs: int, now: datetime) -> _Job:
    """Job `n` of the size's `jobs`, submitted (in order) over the past year, run to the end."""
    draw = random.Random(f"{label}/{n}")
    job_id = finished_job_id(label, n)
    tenant = draw.choice(TENANTS)
    gpus = draw.choice(GPU_MIX)
    node = f"node-{draw.randrange(NODES)}"
    first = draw.randrange(NODE_GPUS - gpus + 1)
    uuids = [f"GPU-{node}-{i}" for i in range(first, first + gpus)]
    submitted = now - HISTORY * (1 - n / jobs)
    started = submitted + timedelta(seconds=draw.uniform(1, 600))
    run = timedelta(seconds=draw.uniform(600, 6 * 3600))
    commands: list[Command] = [
        Submit(job_id, tenant, MANIFESTS[draw.choice(TEAMS), gpus], submitted),
        Deploy([node], uuids, n + 1, started),
        EnterPhase(JobStatus.DOWNLOADING, started + timedelta(seconds=2)),
        EnterPhase(JobStatus.PROCESSING, started + timedelta(seconds=30)),
    ]
    commands += [
        SaveCheckpoint(k * 1000, f"checkpoints/{k}", 50 << 20, 1.5, started + run * k / 5)
        for k in range(1, 5)
    ]
    ended = started + run + timedelta(seconds=60)
    commands += [EnterPhase(JobStatus.STORING, started + run), Complete([0], ended)]
    job: Job | None = None
    events: list[JobEvent] = []
    for command in commands:
        for event in decide(command, job):
            job = evolve(job, event)
            events.append(event)
    return _Job(job_id, tenant, node, uuids, n + 1, started, ended, events)


async def _append_batch(
    pool: asyncpg.Pool, store: EventStore, label: str, ns: range, jobs: int
) -> None:
    """Jobs `ns` with their released allocations and log lines, in one transaction."""
    now = datetime.now(UTC)
    batch = [_finished_job(label, n, jobs, now) for n in ns]
    appends = [
        StreamAppend(
            job_stream(job.job_id),
            0,
            job.events,
            Metadata(actor=f"agent:{job.node}", tenant=job.tenant),
        )
        for job in batch
    ]
    async with pool.acquire() as conn, conn.transaction():
        appended = await store.append_many(appends, conn=conn)
        kept = [job for job, done in zip(batch, appended, strict=True) if done is not None]
        await conn.copy_records_to_table(
            "allocations",
            records=[
                (
                    j.job_id,
                    1,
                    0,
                    j.tenant,
                    j.node,
                    j.epoch,
                    j.gpus,
                    4.0,
                    16_384,
                    j.submitted,
                    j.ended,
                )
                for j in kept
            ],
            columns=ALLOCATION_COLUMNS,
        )
        await conn.copy_records_to_table(
            "job_logs",
            records=[
                (j.job_id, 1, 0, "stdout", seq, seq, j.ended, line, j.tenant)
                for j in kept
                for seq, line in enumerate(LOG_LINES, start=1)
            ],
            columns=LOG_COLUMNS,
        )
        await conn.copy_records_to_table(
            "job_log_heads",
            records=[(j.job_id, len(LOG_LINES), j.ended) for j in kept],
        )
        await conn.copy_records_to_table(
            "job_log_series",
            records=[(j.job_id, 1, 0, "stdout", len(LOG_LINES)) for j in kept],
        )


ALLOCATION_COLUMNS = (
    "job_id",
    "attempt",
    "learner",
    "tenant",
    "node",
    "epoch",
    "gpus",
    "cpus",
    "memory_mb",
    "allocated_at",
    "released_at",
)
LOG_COLUMNS = ("job_id", "attempt", "learner", "stream", "seq", "id", "at", "line", "tenant")
LOG_LINES = (
    "epoch 10/10 loss 0.0123 accuracy 0.9871 throughput 1834.2 samples/s",
    "saved the final model to /output/model.pt (52,428,800 bytes)",
)
