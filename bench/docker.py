"""`trainyard bench docker`: what starting a learner container costs through the Docker runtime,
against the docker CLI starting the same container, and how soon a submitted job runs with it.

- container_start: ROUNDS rounds, each starting one container both ways, in alternating order
  (so that drift in the machine's load hits both alike), the same image, command and settings
  (limits, isolation, labels, mounts: the CLI's flags are made from the runtime's own
  configuration). Ours: from just before `DockerRuntime.start` (create, start) until the first
  line of the container's log arrives through `lines()`. The CLI's: from just before spawning
  `docker run --rm` until the first line arrives on its standard output. The command prints a
  line at once and exits; the removal afterwards is not timed. ratio_vs_cli: ours over the
  CLI's, at p50 (target <= TARGET_RATIO).
- submit_to_processing: `bench.claims`'s latency part with a Docker-runtime agent: no-op jobs in
  the learner image submitted steadily, each timed from just before its submit to its
  JobProcessing event (the launcher reports PROCESSING from inside the container), on a scratch
  database.

Needs a Docker engine and the learner image (images/build.sh).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any
from uuid import uuid4

import aiodocker

from bench.claims import STAGES, ms, p99, submit_latency
from bench.scratch import scratch_database
from controlplane.jobs.manifest import JobManifest
from node_agent.agent import AgentConfig
from node_agent.cli import LAUNCHERS
from node_agent.containers import container_config
from node_agent.docker_runtime import DockerRuntime
from node_agent.images import LEARNER_IMAGE
from node_agent.runtime import Folder, LearnerSpec
from node_agent.runtimes import docker_answers

ROUNDS = 30
TARGET_RATIO = 1.1
TARGET_SUBMIT_P99_MS = 1500
COMMAND = ["python3", "-c", "print('ready', flush=True)"]
NODE = "bench-docker"
NO_OP = JobManifest.model_validate(
    {"name": "bench", "image": LEARNER_IMAGE, "command": ["python3", "-c", "pass"]}
)

Say = Callable[[str], None]


class EngineMissing(Exception):
    """No engine answers, or the learner image is not on this machine."""


async def learner_image_missing() -> str | None:
    """Why learners cannot run in Docker here, if they cannot."""
    if not await docker_answers():
        return "no Docker engine answers"
    async with aiodocker.Docker() as docker:
        if not await docker.images.list(filter=LEARNER_IMAGE):
            return f"no {LEARNER_IMAGE} image (images/build.sh builds it)"
    return None


async def run(url: str, *, rounds: int, progress: bool = False) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr)

    missing = await learner_image_missing()
    if missing is not None:
        raise EngineMissing(missing)
    async with aiodocker.Docker() as docker:
        with tempfile.TemporaryDirectory() as work:
            starts = await _container_starts(DockerRuntime(docker), Path(work), rounds, say)
    ours, cli = starts["ours"], starts["cli"]
    async with scratch_database(url, "docker") as scratch:
        with tempfile.TemporaryDirectory() as work:
            os.chmod(work, 0o711)  # passable by learners that run as users of their own
            config = AgentConfig(
                name=NODE,
                work_dir=Path(work),
                cpus=64,
                memory_mb=1 << 20,
                launcher=LAUNCHERS["docker"],
                runtime="docker",
                request_gpus=False,
            )
            latency = await submit_latency(scratch, config, NO_OP, say)
    return {
        "image": LEARNER_IMAGE,
        "rounds": rounds,
        "container_start_p50_ms": ms(statistics.median(ours)),
        "container_start_p99_ms": ms(p99(ours)),
        "cli_container_start_p50_ms": ms(statistics.median(cli)),
        "cli_container_start_p99_ms": ms(p99(cli)),
        "ratio_vs_cli": round(statistics.median(ours) / statistics.median(cli), 3),
        "target_ratio_vs_cli": TARGET_RATIO,
        "target_submit_to_processing_p99_ms": TARGET_SUBMIT_P99_MS,
        "latency_jobs": latency["latency_jobs"],
        # submit_to_processing_p50_ms and _p99_ms, and the same for each stage on the way.
        **{
            key: latency[key]
            for name, _, _ in STAGES
            for key in (f"{name}_p50_ms", f"{name}_p99_ms")
        },
    }


def _spec(work: Path) -> LearnerSpec:
    return LearnerSpec(
        job_id=uuid4(),
        attempt=1,
        learner=0,
        epoch=1,
        node=NODE,
        image=LEARNER_IMAGE,
        command=COMMAND,
        env={},
        workdir=work / "learner",
        gpus=[],
        cpus=1.0,
        memory_mb=1024,
        folders=[Folder(work, work / "learner")],
        # A job's user, as an agent that is root gives; else the agent's own.
        user=(200000, 200000) if os.geteuid() == 0 else None,
    )


async def _container_starts(
    runtime: DockerRuntime, work: Path, rounds: int, say: Say
) -> dict[str, list[float]]:
    sides: dict[str, Callable[[LearnerSpec], Awaitable[float]]] = {
        "ours": lambda spec: _ours(runtime, spec),
        "cli": _cli,
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    say(f"container starts: {rounds} rounds, ours and the docker CLI's ...")
    # One of each first, untimed: the image's files into the page cache, the CLI's binary too.
    for start in sides.values():
        await start(_spec(work))
    for round_ in range(rounds):
        order = list(sides.items()) if round_ % 2 == 0 else list(reversed(sides.items()))
        for name, start in order:
            times[name].append(await start(_spec(work)))
    return times


async def _ours(runtime: DockerRuntime, spec: LearnerSpec) -> float:
    began = time.perf_counter()
    learner = await runtime.start(spec)
    async with aclosing(learner.lines()) as lines:
        await anext(lines)
        took = time.perf_counter() - began
    await learner.wait()
    await learner.remove()
    return took


async def _cli(spec: LearnerSpec) -> float:
    began = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *_run_command(spec), stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    if not await process.stdout.readline():
        raise RuntimeError(f"docker run printed nothing (exit {await process.wait()})")
    took = time.perf_counter() - began
    await process.wait()
    return took


def _run_command(spec: LearnerSpec) -> list[str]:
    """`docker run` of the container the runtime would create for `spec`: the same settings,
    as CLI flags."""
    config = container_config(spec, request_gpus=False)
    host = config["HostConfig"]
    words = ["docker", "run", "--rm", "--name", f"bench-cli-{spec.job_id}"]
    words += ["--network", host["NetworkMode"], "--user", config["User"]]
    words += [f"--cap-drop={cap}" for cap in host["CapDrop"]]
    words += [f"--security-opt={option}" for option in host["SecurityOpt"]]
    words += ["--read-only", "--workdir", config["WorkingDir"]]
    words += [f"--tmpfs={path}:{options}" for path, options in host["Tmpfs"].items()]
    words += [f"--cpus={host['NanoCpus'] / 1e9}", f"--memory={host['Memory']}b"]
    words += [f"--memory-swap={host['MemorySwap']}b", f"--pids-limit={host['PidsLimit']}"]
    words += [f"--shm-size={host['ShmSize']}b", f"--log-driver={host['LogConfig']['Type']}"]
    words += [f"--log-opt={key}={value}" for key, value in host["LogConfig"]["Config"].items()]
    for mount in host["Mounts"]:
        mode = "ro" if mount["ReadOnly"] else "rw"
        words.append(f"--volume={mount['Source']}:{mount['Target']}:{mode}")
    words += [f"--label={key}={value}" for key, value in config["Labels"].items()]
    words += [f"--env={variable}" for variable in config["Env"]]
    words += ["--entrypoint", config["Entrypoint"][0], config["Image"], *config["Cmd"]]
    return words
