"""`trainyard bench simulate`: record a real run of many short jobs of three tenants on
fake-GPU agents, then replay it with the scheduling simulator (`sim/`) and compare.

The recording, on a scratch database: a control plane process (`trainyard serve`: its
projections feed the claim queue) and `agents` node agents (`trainyard agent`, process runtime,
`gpus` fake GPUs each); tenants TENANTS with weights 1, 2 and 3 and no quota. `jobs` jobs, drawn
from a seeded random generator (`seed`): a tenant (each alike), priority 1 for a share
PRIORITY_SHARE (else 0), and one learner on one GPU that runs `sleep S`, S uniform in
[RUN_MIN_S, RUN_MAX_S] (its launcher adds its own start-up). One GPU each: a job of two starts
where two GPUs of a node come free at once, which hangs on how the agents' ends fall within
milliseconds, and that no replay reproduces (tests/sim/ replay such jobs). A burst of BURST jobs
is submitted first, as fast as the job service takes them (so that the queue grows past a
thousand and fair share decides who runs), then the rest at about the pace the cluster finishes
jobs (`gpus` over the mean run time, LAUNCH_S added). Through the job service (`Jobs.submit`,
what `POST /v1/jobs` calls), in this process; until every job has ended. The run lasts about as
long as its makespan: the replay's speed against real time is the makespan over the replay's
time, so a shorter run (fewer jobs, shorter ones, more GPUs) shows a smaller speedup.

The replay: the log read in one READ ONLY transaction and made a workload (`read_s`), then the
current policy replayed over it three times.

- `recorded_makespan_s`: from the first submission to the last job's end, as recorded.
- `simulation_s`: the median wall time of the three replays (the workload in memory, out of
  the garbage collector's walk as `trainyard simulate` has it; the report's figures not
  included).
- `speedup_vs_realtime`: recorded_makespan_s / simulation_s. Target >= 10,000.
- `start_order_agreement`: the share of pairs of jobs that the replay claimed in the recorded
  order (Kendall's; every job ran in both). Target >= 0.95.
- `start_time_error`: the mean |replayed - recorded| first claim, as a share of the recorded
  makespan. Target <= 0.02.
- `deterministic`: 1 when the three replays' reports (JSON) are byte for byte the same.
- `release_delay_s`: how long a busy GPU took to be claimed again after a job's end, as the
  replay measured it from the log (`sim/recording.py`).
- `queued_after_burst`: the jobs queued (not claimed yet) once the burst was in.
- `policies`: the replay under each named policy: makespan, Jain's fairness (over the
  tenants' weighted GPU shares while they waited, `sim/metrics.py`) and each tenant's wait
  p50/p95.
- `reasons_coverage` (and `reasons_coverage_all`, `coverage_samples`), `reason_latency_p99_ms`
  (and `reason_changes_timed`): the pending reasons as the recorded run's jobs got them,
  watched during the recording (definitions: `bench/pending.py`, ReasonWatch). Targets 1.0 and
  <= 1,000 ms.
- `claim_slowdown` (and `claim_slowdown_pairs`, `claims_per_s_with_reasons`,
  `claims_per_s_without_reasons`): claims with the pending-reasons recorder running against
  without, in pairs of rounds, on a scratch database of its own
  after the recording (definitions: `bench/pending.py`). Target <= 0.10.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench.pending import QUEUE, SECONDS, ReasonWatch, claim_slowdown
from bench.scratch import scratch_database
from controlplane.database import create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.heap import freeze_startup_heap
from controlplane.jobs.events import JobCancelled, JobCompleted, JobFailed, JobSubmitted
from controlplane.jobs.images import DEFAULT_IMAGES
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.service import Jobs
from controlplane.projections.runner import ProjectionRunner
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import create_tenant
from harness.agent_process import AgentProcess
from harness.processes import started
from harness.served import ServedControlPlane
from sim.engine import simulate
from sim.log import read_workload
from sim.metrics import span
from sim.policy import NAMED, current
from sim.report import as_json, dumps, report
from sim.workload import Workload

TENANTS = {"acme": 1.0, "globex": 2.0, "initech": 3.0}
PRIORITY_SHARE = 0.1
RUN_MIN_S = 1.0
RUN_MAX_S = 5.0
BURST = 1200
LAUNCH_S = 0.5
"""About how long a learner's launcher and its agent add to its `sleep` on this machine."""
REPLAYS = 3
PROBE_S = 0.5
STALL_S = 120.0
"""How long the recording may go without a job ending before it is called stuck. Not a bound
on its whole time: on a slower machine than LAUNCH_S was measured on, each job's start costs
more CPU (2 cores start the learners of 12 GPUs), and a run of 2,000 jobs took 30 % longer than
the expected makespan, past any fixed margin, while it went on ending jobs."""
TARGETS = {
    "speedup_vs_realtime": ">= 10000",
    "start_order_agreement": ">= 0.95",
    "start_time_error": "<= 0.02",
    "deterministic": "1",
    "reasons_coverage": "1.0",
    "reason_latency_p99_ms": "<= 1000",
    "claim_slowdown": "<= 0.10",
}

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Planned:
    """A job to submit."""

    tenant: str
    priority: int
    sleep_s: float

    def manifest(self) -> JobManifest:
        return JobManifest.model_validate(
            {
                "name": f"sleep-{self.sleep_s:.2f}",
                "image": DEFAULT_IMAGES,
                "command": ["sleep", f"{self.sleep_s:.3f}"],
                "gpus_per_learner": 1,
                "priority": self.priority,
                "cpus": 0.1,
                "memory_mb": 64,
            }
        )


@dataclass(frozen=True, slots=True)
class Recording:
    """A recording in progress: what the pending reasons' measurements work against."""

    database: str
    pool: asyncpg.Pool
    store: EventStore
    jobs: int
    ended: asyncio.Event
    """Set once every job has ended: measurements beside the recording stop then."""


def plan(jobs: int, seed: int) -> list[Planned]:
    rng = random.Random(seed)
    return [
        Planned(
            tenant=rng.choice(sorted(TENANTS)),
            priority=1 if rng.random() < PRIORITY_SHARE else 0,
            sleep_s=round(rng.uniform(RUN_MIN_S, RUN_MAX_S), 3),
        )
        for _ in range(jobs)
    ]


async def run(
    url: str,
    *,
    jobs: int,
    agents: int,
    gpus: int,
    seed: int,
    claim_queue: int = QUEUE,
    claim_seconds: float = SECONDS,
    progress: bool = False,
) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr)

    jobs_planned = plan(jobs, seed)
    async with scratch_database(url, "simulate") as database:
        pool = await create_pool(database, min_size=2, max_size=8)
        try:
            recorded = await _record(database, pool, jobs_planned, agents, gpus, say)
            say("replaying the log ...")
            replayed = await _replay(pool)
        finally:
            await pool.close()
    say("claims with and without the pending reasons ...")
    slowdown = await claim_slowdown(url, queue=claim_queue, seconds=claim_seconds)
    return {
        "jobs": jobs,
        "tenants": TENANTS,
        "agents": agents,
        "gpus_per_agent": gpus,
        "seed": seed,
        **recorded,
        **replayed,
        **slowdown,
        "targets": TARGETS,
    }


async def _record(
    database: str,
    pool: asyncpg.Pool,
    planned: list[Planned],
    agents: int,
    gpus: int,
    say: Say,
) -> dict[str, Any]:
    store = EventStore(pool, EVENT_REGISTRY)
    runner = ProjectionRunner(pool, store, LogListener(database), [TenantsProjection()])
    for name, weight in TENANTS.items():
        await create_tenant(store, runner, name, weight, actor="bench")
    with tempfile.TemporaryDirectory(prefix="trainyard-simulate-") as root:
        # Passable by learners that run as users of their own (the agents are root).
        os.chmod(root, 0o711)
        plane = ServedControlPlane(database, Path(root) / "plane")
        nodes = [
            AgentProcess(
                database,
                Path(root) / f"sim-{k}",
                f"sim-{k}",
                fake_gpus=gpus,
                log=Path(root) / f"sim-{k}.log",
            )
            for k in range(agents)
        ]
        async with started(plane, nodes, pool):
            recording = Recording(database, pool, store, len(planned), asyncio.Event())
            async with asyncio.TaskGroup() as group:
                reasons = group.create_task(pending_reasons(recording))
                queued = await _submit_and_wait(store, pool, planned, agents * gpus, say)
                recording.ended.set()
    return {"queued_after_burst": queued, **reasons.result()}


async def _submit_and_wait(
    store: EventStore, pool: asyncpg.Pool, planned: list[Planned], gpus: int, say: Say
) -> int:
    """Submit the plan (a burst, then at the cluster's pace); wait until every job has ended.
    How many jobs were queued (never claimed yet) once the burst was in."""
    service = Jobs(store)
    burst, rest = planned[:BURST], planned[BURST:]
    say(f"recording: a burst of {len(burst)} jobs ...")
    for job in burst:
        await _submit(service, job)
    queued = await _queued(pool)
    # About the pace at which the cluster finishes jobs: the queue stays as deep until the end.
    rate = gpus / (statistics.mean(p.sleep_s for p in planned) + LAUNCH_S)
    say(f"recording: {len(rest)} more at {rate:.1f}/s ...")
    for job in rest:
        await asyncio.sleep(1 / rate)
        await _submit(service, job)
    done, progressed = -1, time.monotonic()
    while (ended := await _ended(pool)) < len(planned):
        if ended > done:
            done, progressed = ended, time.monotonic()
        elif time.monotonic() - progressed > STALL_S:
            raise TimeoutError(f"no job ended in {STALL_S:g} s ({done}/{len(planned)} ended)")
        say(f"recording: {done}/{len(planned)} jobs ended")
        await asyncio.sleep(PROBE_S * 10)
    failed = await pool.fetchval("SELECT count(*) FROM events WHERE type = $1", JobFailed.type_name)
    if failed:
        reason = await pool.fetchval(
            "SELECT data ->> 'reason' FROM events WHERE type = $1 LIMIT 1", JobFailed.type_name
        )
        raise RuntimeError(f"{failed} bench job(s) failed; one: {reason}")
    return queued


async def _submit(service: Jobs, job: Planned) -> None:
    await service.submit(job.tenant, job.manifest(), Metadata(actor="bench", tenant=job.tenant))


async def _ended(pool: asyncpg.Pool) -> int:
    ends = [t.type_name for t in (JobCompleted, JobFailed, JobCancelled)]
    return int(await pool.fetchval("SELECT count(*) FROM events WHERE type = ANY($1)", ends))


async def _queued(pool: asyncpg.Pool) -> int:
    submitted = await pool.fetchval(
        "SELECT count(*) FROM events WHERE type = $1", JobSubmitted.type_name
    )
    started = await pool.fetchval(
        "SELECT count(DISTINCT stream_id) FROM events WHERE type = 'JobDeploying'"
    )
    return int(submitted) - int(started)


async def _replay(pool: asyncpg.Pool) -> dict[str, Any]:
    started = time.perf_counter()
    workload = await read_workload(pool, None, None)
    read_s = time.perf_counter() - started
    freeze_startup_heap()  # as `trainyard simulate` does once it has read the past
    in_force = current(workload.policy)
    outputs, times = [], []
    for _ in range(REPLAYS):
        started = time.perf_counter()
        outcomes = simulate(workload, in_force)
        times.append(time.perf_counter() - started)
        outputs.append(dumps(report(workload, in_force, outcomes)))
    figures = as_json(report(workload, in_force, simulate(workload, in_force)))
    window = span(workload.recorded)
    makespan = window[1] - window[0] if window is not None else 0.0
    simulation_s = statistics.median(times)
    return {
        "recorded_makespan_s": round(makespan, 3),
        "read_s": round(read_s, 3),
        "simulation_s": round(simulation_s, 6),
        "speedup_vs_realtime": round(makespan / simulation_s),
        "start_order_agreement": figures["difference"]["start_order_agreement"],
        "start_time_error": figures["difference"]["start_time_error"],
        "deterministic": int(len(set(outputs)) == 1),
        "release_delay_s": figures["release_delay_s"],
        "policies": _policies(workload),
    }


def _policies(workload: Workload) -> dict[str, Any]:
    found = {}
    for name, policy in {"current": current(workload.policy), **NAMED}.items():
        figures = as_json(report(workload, policy, simulate(workload, policy)))["simulated"]
        found[name] = {
            "makespan_s": figures["makespan_s"],
            "jain_fairness": figures["jain_fairness"],
            "waits_s": {
                tenant: [t["wait_p50_s"], t["wait_p95_s"]]
                for tenant, t in figures["tenants"].items()
            },
        }
    return found


async def pending_reasons(recording: Recording) -> dict[str, Any]:
    """The pending reasons as the recorded run's jobs got them (`bench.pending.ReasonWatch`),
    watched from before the first submission until `recording.ended` is set."""
    watch = ReasonWatch(recording.pool)
    await watch.run(recording.ended)
    return watch.figures()
