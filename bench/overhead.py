"""`trainyard bench overhead`: what running a training job through Trainyard costs the training
itself, against running the same script by hand.

- bare: `python -m runners.examples.classifier` as a plain child process, its output into a
  file, with TRAINYARD_CHECKPOINT_DIR and TRAINYARD_RESULTS_DIR in a temporary directory and the
  same checkpoint interval and retention as the system run.
- process: the same command submitted as a job through the whole system, run in this process:
  the control plane's projections and job service on a scratch database (running for the whole
  benchmark, as a service does), and for each run one real node agent with the process runtime
  (`runners.launch` wrapping the command, the learner's stdout and stderr read by the agent,
  every line shipped to Postgres), started before the submit and stopped once the job is
  COMPLETED. Its metrics are read back as users read them (`read_metrics`), its checkpoints
  from its CheckpointSaved events.
- docker: the same through the system with the Docker runtime, the example run in the learner
  image (its own Python and torch, in a container limited to the machine's CPUs and memory);
  when no engine answers or the image is missing, a reason says so instead.
- checkpoint: the median `duration_s` and `size_bytes` of the `checkpoint_saved` reports of
  every run (both sides save the same state).

Both sides measure training speed the same way, from the learner's own metric reports: the steps
between the first and the last training report over the time between their `at`. Startup
(interpreter and torch imports, scheduling, the launcher) is not training overhead, so it is
reported apart as `startup_s`: from just before the spawn (bare) or the submit (process) to the
first metric report. Bare and process runs alternate for `rounds` rounds, so that drift in the
machine's load hits both alike; speeds are medians over the rounds.

On a small machine a difference of a few percent is as likely to come from another workload as
from Trainyard: with two cores, the agent and Postgres share the second core with whatever else
runs, and take from the learner's core only when that one is busy too. So each side also reports
`busy_cores`, the machine-wide CPU in use during its runs (Linux: /proc/stat): a run takes about
one core, and clearly more means something else shared the machine and the numbers are suspect.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

from bench.docker import learner_image_missing
from bench.scratch import scratch_database
from controlplane.composition import projection_runner
from controlplane.database import create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.events import CheckpointSaved
from controlplane.jobs.lifecycle import JobStatus
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.service import Jobs
from controlplane.jobs.streams import job_stream
from controlplane.logs.metrics import MetricPoint, read_metrics
from controlplane.tenants.service import create_tenant
from harness.served import until_registered
from node_agent.agent import AgentConfig
from node_agent.cli import LAUNCHERS, machine_memory_mb
from node_agent.images import LEARNER_IMAGE
from node_agent.service import run_agent
from runners import config as runner_env
from runners import protocol

SEED = 7
CHECKPOINT_INTERVAL_S = 1
"""Short, so that every run saves several checkpoints and their cost is part of both sides."""
CHECKPOINT_KEEP = 3
TARGET_OVERHEAD_PCT = 2.0
TRAINING_METRIC = "loss"
"""The example's per-step report carries it; its last report (`final_loss`, `accuracy`) follows
an evaluation of the whole data set, which is no training step and would skew the speed."""
JOB_POLL_S = 1.0
"""Slow on purpose: the poll runs in the agent's process and must not load the machine."""
WAIT_S = 600.0

TENANT = "bench"
USER = Metadata(actor="bench", tenant=TENANT)
AGENT = "bench-overhead"

Say = Callable[[str], None]


async def run(
    url: str, *, steps: int, rounds: int, device: str = "cpu", progress: bool = False
) -> dict[str, Any]:
    """`device`: where the example trains, "cpu" (one thread) or "cuda" (a GPU of the
    machine's, found by NVML: the system run's agent offers the real ones)."""

    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr)

    bare: list[_Run] = []
    process: list[_Run] = []
    docker: list[_Run] = []
    no_docker = await learner_image_missing()
    async with scratch_database(url, "overhead") as scratch, _plane(scratch) as plane:
        for round_ in range(1, rounds + 1):
            say(f"round {round_}/{rounds}: bare, {steps} steps ...")
            bare.append(await asyncio.to_thread(_bare, steps, device))
            say(f"round {round_}/{rounds}: through the system, {steps} steps ...")
            process.append(await _through_system(plane, steps, "process", device))
            if no_docker is None:
                say(f"round {round_}/{rounds}: through the system in Docker, {steps} steps ...")
                docker.append(await _through_system(plane, steps, "docker", device))
    bare_rate = statistics.median(r.steps_per_s for r in bare)
    checkpoints = [c for r in bare + process + docker for c in r.checkpoints]
    return {
        "steps": steps,
        "rounds": rounds,
        "device": device,
        "seed": SEED,
        "checkpoint_interval_s": CHECKPOINT_INTERVAL_S,
        "target_overhead_pct": TARGET_OVERHEAD_PCT,
        "bare": _side(bare),
        "process": _against(process, bare_rate),
        "docker": (
            _against(docker, bare_rate)
            if no_docker is None
            else {"steps_per_s": None, "overhead_pct": None, "reason": no_docker}
        ),
        "checkpoint": _checkpoint_figures(checkpoints),
    }


def _checkpoint_figures(checkpoints: list[_Checkpoint]) -> dict[str, Any]:
    """Median time and size of a checkpoint; None for runs too short to take one."""
    if not checkpoints:
        return {"ms": None, "mb": None, "samples": 0}
    return {
        "ms": round(statistics.median(c.duration_s for c in checkpoints) * 1000, 2),
        "mb": round(statistics.median(c.size_bytes for c in checkpoints) / 1e6, 3),
        "samples": len(checkpoints),
    }


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    duration_s: float
    size_bytes: int


@dataclass(frozen=True, slots=True)
class _Run:
    steps_per_s: float
    startup_s: float
    busy_cores: float
    checkpoints: list[_Checkpoint]


class _Busy:
    """The machine's CPU in use (all processes, in cores) from its creation to `cores()`."""

    def __init__(self) -> None:
        self._cpu_s = self._busy_cpu_s()
        self._at = time.monotonic()

    def cores(self) -> float:
        return (self._busy_cpu_s() - self._cpu_s) / (time.monotonic() - self._at)

    @staticmethod
    def _busy_cpu_s() -> float:
        # The first line sums every CPU: user, nice, system, idle, iowait, irq, softirq, ...
        ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        user, nice, system, _idle, _iowait, irq, softirq = ticks[:7]
        return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _measured(
    started: datetime,
    busy_cores: float,
    points: Sequence[MetricPoint],
    checkpoints: list[_Checkpoint],
) -> _Run:
    training = sorted((p for p in points if TRAINING_METRIC in p.values), key=lambda p: p.at)
    if len(training) < 2:
        raise RuntimeError(f"{len(training)} training metric report(s); at least 2 are needed")
    first, last = training[0], training[-1]
    seconds = (last.at - first.at).total_seconds()
    return _Run(
        steps_per_s=(last.step - first.step) / seconds,
        startup_s=(first.at - started).total_seconds(),
        busy_cores=busy_cores,
        checkpoints=checkpoints,
    )


def _side(runs: Sequence[_Run]) -> dict[str, Any]:
    return {
        "steps_per_s": round(statistics.median(r.steps_per_s for r in runs), 1),
        "startup_s": round(statistics.median(r.startup_s for r in runs), 2),
        "busy_cores": round(statistics.median(r.busy_cores for r in runs), 2),
        "samples_steps_per_s": [round(r.steps_per_s, 1) for r in runs],
    }


def _against(runs: Sequence[_Run], bare_rate: float) -> dict[str, Any]:
    rate = statistics.median(r.steps_per_s for r in runs)
    return {**_side(runs), "overhead_pct": round((bare_rate - rate) / bare_rate * 100, 2)}


def _command(steps: int, device: str, python: str = sys.executable) -> list[str]:
    return [
        python,
        "-m",
        "runners.examples.classifier",
        "--seed",
        str(SEED),
        "--steps",
        str(steps),
        "--device",
        device,
    ]


# Bare: the example as a plain child process.


def _bare(steps: int, device: str) -> _Run:
    """One bare run (blocking: run it in a thread, so the plane's tasks keep running)."""
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-bare-") as work:
        root = Path(work)
        env = {
            **os.environ,
            runner_env.CHECKPOINT_DIR: str(root / "checkpoints"),
            runner_env.RESULTS_DIR: str(root / "results"),
            runner_env.CHECKPOINT_INTERVAL: str(CHECKPOINT_INTERVAL_S),
            runner_env.CHECKPOINT_KEEP: str(CHECKPOINT_KEEP),
        }
        output = root / "output"
        busy, started = _Busy(), datetime.now(UTC)
        # A file, not a pipe this process reads: the cheapest place output can go, so any
        # cost of the agent reading the learner's pipes shows as overhead.
        with output.open("wb") as sink:
            done = subprocess.run(
                _command(steps, device),
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                check=False,
            )
        cores = busy.cores()
        lines = output.read_text(errors="replace").splitlines()
    if done.returncode != 0:
        tail = "\n".join(lines[-20:])
        raise RuntimeError(f"the bare run exited with {done.returncode}:\n{tail}")
    points: list[MetricPoint] = []
    checkpoints: list[_Checkpoint] = []
    for line in lines:
        match protocol.parse(line):
            case protocol.Metric(step=step, at=at, values=values):
                points.append(MetricPoint(attempt=1, learner=0, step=step, at=at, values=values))
            case protocol.CheckpointSaved(duration_s=duration_s, size_bytes=size_bytes):
                checkpoints.append(_Checkpoint(duration_s, size_bytes))
    return _measured(started, cores, points, checkpoints)


# Process: the example through the whole system.


@dataclass(frozen=True, slots=True)
class _Plane:
    pool: asyncpg.Pool
    store: EventStore
    jobs: Jobs
    url: str


@asynccontextmanager
async def _plane(url: str) -> AsyncIterator[_Plane]:
    """The control plane's projections (running in the background, as `trainyard serve` runs
    them) and a job service, with the bench's tenant."""
    pool = await create_pool(url, min_size=2, max_size=4)
    store = EventStore(pool, EVENT_REGISTRY)
    listener = LogListener(url)
    runner = projection_runner(pool, store, listener)
    tasks = [asyncio.create_task(listener.run()), asyncio.create_task(runner.run())]
    try:
        await create_tenant(store, runner, TENANT, actor="bench")
        yield _Plane(pool, store, Jobs(store), url)
    finally:
        runner.stop()
        listener.stop()
        listener.wake()
        await asyncio.gather(*tasks)
        await store.close()
        await pool.close()


async def _through_system(plane: _Plane, steps: int, runtime: str, device: str) -> _Run:
    # In a container, the image's interpreter (the node's is not there).
    python = "python3" if runtime == "docker" else sys.executable
    manifest = JobManifest.model_validate(
        {
            "name": "bench-overhead",
            "image": LEARNER_IMAGE,
            "command": _command(steps, device, python),
            "gpus_per_learner": 1 if device == "cuda" else 0,
            # All of the machine, as the bare run has (the default is one CPU and 2 GiB).
            "cpus": float(os.cpu_count() or 1),
            "memory_mb": machine_memory_mb() // 2,
            "checkpoint": {"interval_seconds": CHECKPOINT_INTERVAL_S, "keep": CHECKPOINT_KEEP},
            # A second attempt would mix two runs' reports into one measurement: fail instead.
            "max_restarts": 0,
        }
    )
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-agent-") as work:
        # Passable by learners that run as users of their own (when the agent is root).
        os.chmod(work, 0o711)
        # The agent as `trainyard agent` starts by default on a machine without GPUs (the job
        # asks for none): all CPUs and memory offered, default heartbeat and poll intervals.
        config = AgentConfig(
            name=AGENT,
            work_dir=Path(work),
            cpus=float(os.cpu_count() or 1),
            memory_mb=machine_memory_mb(),
            launcher=LAUNCHERS[runtime],
            runtime=runtime,
        )
        stop, registered = asyncio.Event(), asyncio.Event()
        agent = asyncio.create_task(
            run_agent(
                plane.url,
                config,
                # The machine's own GPUs (NVML) for a GPU run; none pretended otherwise.
                fake_gpus=None if device == "cuda" else 0,
                stop=stop,
                registered=registered,
            )
        )
        try:
            await until_registered(agent, registered)
            busy, started = _Busy(), datetime.now(UTC)
            job, _ = await plane.jobs.submit(TENANT, manifest, USER)
            await _until_completed(plane.jobs, job.job_id, agent)
            cores = busy.cores()
        finally:
            # Stopping the agent ships its last log lines, so the metrics read below are all.
            stop.set()
            await asyncio.wait_for(agent, 30)
    points = await read_metrics(plane.pool, job.job_id)
    checkpoints = [
        _Checkpoint(recorded.event.duration_s, recorded.event.size_bytes)
        for recorded in await plane.store.read_stream(job_stream(job.job_id))
        if isinstance(recorded.event, CheckpointSaved)
    ]
    return _measured(started, cores, points, checkpoints)


async def _until_completed(jobs: Jobs, job_id: UUID, agent: asyncio.Task[None]) -> None:
    async with asyncio.timeout(WAIT_S):
        while True:
            job = await jobs.load(job_id)
            if job is not None and job.state is JobStatus.COMPLETED:
                return
            if job is not None and job.state.terminal:
                raise RuntimeError(f"the bench job ended {job.state}: {job.failure_reason}")
            if agent.done():
                agent.result()
                raise RuntimeError("the agent stopped before the bench job completed")
            await asyncio.sleep(JOB_POLL_S)
