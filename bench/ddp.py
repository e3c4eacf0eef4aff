"""`trainyard bench ddp`: a job whose learners train together (issue 34), on one node for now.

One real agent (process runtime; sandboxed, each job's learners in a network namespace of their
own, when it runs as root) on the agent port's in-memory twin (`MemoryPort`: the control plane's
side is not what these figures measure), running `runners.examples.digits_ddp` (gloo, on the
CPU, one thread a rank, a checkpoint by rank 0 every `checkpoint_every` steps). Three jobs, one
after the other, all with the same global batch and a metric line every step:

- one learner, uninterrupted: the reference for scaling;
- two learners, uninterrupted: `rendezvous_s` is from the attempt's DEPLOYING until the last
  rank wrote that its process group is formed (`runners.distributed.READY_LINE`): the agent
  starting both, their interpreters importing torch, and the rendezvous itself;
  `rendezvous_wait_s` is the longest any rank spent in the rendezvous alone (as that line says).
  `scaling_efficiency` is (two learners' steps per second / one learner's) / 2, over the steps
  between the first and the last metric line: on a machine of few cores the ranks (and the
  agent) share them, which bounds it (`cores` says how many);
- two learners, paced by `step_seconds`, whose rank 1's training command is SIGKILLed once rank
  0 has logged the step halfway between the checkpoint before the middle and the next one:
  `rank_failure_stop_s` is from the kill until no process of the attempt is left on the
  machine; the job restarts both ranks from rank 0's last checkpoint; `resume_exact` is 1 when
  its final weights equal (torch.equal) those of the uninterrupted two-learner job, else 0;
  `lost_steps` is the steps trained again: the last step rank 0 logged before the kill less the
  step attempt 2 restored (the target: at most `checkpoint_every`).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from controlplane.agent_port.memory import MemoryPort
from controlplane.agent_port.wakes import polling
from controlplane.jobs.images import ImageAllowlist
from controlplane.jobs.lifecycle import Job, JobStatus
from controlplane.jobs.manifest import JobManifest
from harness.served import until_registered
from node_agent.agent import AgentConfig
from node_agent.learners import learner_dir
from node_agent.service import run_agent_on
from runners import protocol
from runners.distributed import READY_LINE

TENANT = "bench"
IMAGE = "trainyard-learner:latest"
JOB_TIMEOUT_S = 300.0
POLL_S = 0.02
TARGETS = {
    "rendezvous_s": "<= 5",
    "rank_failure_stop_s": "<= 5",
    "resume_exact": "= 1",
    "lost_steps": "<= checkpoint_every",
}
_WAITED = re.compile(r" after ([0-9.]+) s$")


class BenchFailed(RuntimeError):
    """A job of the benchmark did not end as it must (its log's last lines say why)."""


@dataclass(frozen=True)
class Settings:
    steps: int
    global_batch: int
    checkpoint_every: int
    step_seconds: float

    def command(self, *, paced: bool) -> list[str]:
        return [
            *(sys.executable, "-m", "runners.examples.digits_ddp", "--seed", "3"),
            *("--steps", str(self.steps), "--global-batch", str(self.global_batch)),
            *("--checkpoint-every", str(self.checkpoint_every), "--log-every", "1"),
            *("--step-seconds", str(self.step_seconds if paced else 0.0)),
            *("--device", "cpu", "--weights", "weights.pt"),
        ]


class Node:
    """One agent on the in-memory twin, and the jobs the benchmark submits to it."""

    def __init__(self, work: Path) -> None:
        self.port = MemoryPort()
        self.config = AgentConfig(
            name="bench-ddp",
            work_dir=work / "agent",
            cpus=float(os.cpu_count() or 2),
            memory_mb=8192,
            launcher=(sys.executable, "-m", "runners.launch"),
            heartbeat_s=0.5,
            ttl_s=5,
            grace_s=10,
            poll_s=0.1,
            images=ImageAllowlist.parse(IMAGE),
        )
        self._stop = asyncio.Event()
        self._registered = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(
            run_agent_on(
                self.port,
                polling(self.config.poll_s),
                self.config,
                fake_gpus=0,
                stop=self._stop,
                registered=self._registered,
            )
        )
        await until_registered(self._task, self._registered)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 60)

    def submit(self, command: list[str], learners: int) -> UUID:
        manifest = JobManifest.model_validate(
            {
                "name": f"ddp-{learners}",
                "image": IMAGE,
                "command": command,
                "learners": learners,
                "rendezvous_timeout_s": 60,
            }
        )
        return self.port.submit(TENANT, manifest)

    async def until(self, job_id: UUID, done: Any, what: str) -> Job:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while time.monotonic() < deadline:
            job = self.port.job(job_id)
            if job is not None and done(job):
                return job
            if job is not None and job.state in (JobStatus.FAILED, JobStatus.CANCELLED):
                raise BenchFailed(
                    f"job {job_id} {job.state.value} before {what}: {self.tail(job_id)}"
                )
            await asyncio.sleep(POLL_S)
        raise BenchFailed(
            f"job {job_id}: not {what} within {JOB_TIMEOUT_S:g} s: {self.tail(job_id)}"
        )

    async def completed(self, job_id: UUID) -> Job:
        return await self.until(job_id, lambda job: job.state is JobStatus.COMPLETED, "COMPLETED")

    def tail(self, job_id: UUID) -> list[str]:
        return [line.text for line in self.port.lines(job_id)][-8:]

    def weights_path(self, job: Job) -> Path:
        return learner_dir(self.config.work_dir, job.job_id, job.attempt, 0) / "weights.pt"


def ready_lines(node: Node, job_id: UUID, attempt: int) -> list[tuple[datetime, float]]:
    """Each rank's line that its process group is formed: when it was written, and how long
    the rank waited in the rendezvous."""
    found = []
    for line in node.port.lines(job_id):
        if line.attempt == attempt and line.text.startswith(READY_LINE):
            waited = _WAITED.search(line.text)
            found.append((line.at, float(waited.group(1)) if waited else float("nan")))
    return found


def steps_per_s(node: Node, job_id: UUID) -> float:
    """Training steps a second between the first and the last metric line rank 0 wrote."""
    # Stamped by the learner as it wrote them (the agent reads its files every few hundredths
    # of a second, too coarse for steps of a few milliseconds).
    metrics = [
        (message.at, message.step)
        for line in node.port.lines(job_id)
        if isinstance(message := protocol.parse(line.text), protocol.Metric)
    ]
    (first_at, first), (last_at, last) = metrics[0], metrics[-1]
    return (last - first) / (last_at - first_at).total_seconds()


def logged_step(node: Node, job_id: UUID) -> int:
    """The last step rank 0 logged (0 before any)."""
    steps = [
        message.step
        for line in node.port.lines(job_id)
        if isinstance(message := protocol.parse(line.text), protocol.Metric)
    ]
    return max(steps, default=0)


def processes_of(job_id: UUID, attempt: int) -> dict[int, tuple[int, str]]:
    """This machine's processes of the job's attempt: pid -> (learner, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes().decode(errors="replace").split("\0")
            environ = dict(item.split("=", 1) for item in raw if "=" in item)
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # ended meanwhile, or not ours to read
        ours = (environ.get("TRAINYARD_JOB_ID"), environ.get("TRAINYARD_ATTEMPT"))
        if ours == (str(job_id), str(attempt)):
            found[int(entry.name)] = (int(environ["TRAINYARD_LEARNER"]), cmdline)
    return found


def training_command(job_id: UUID, learner: int) -> int:
    """The pid of the learner's training command (not its launcher, nor its sandbox)."""
    for pid, (index, cmdline) in processes_of(job_id, 1).items():
        if index == learner and "digits_ddp" in cmdline and "runners.launch" not in cmdline:
            return pid
    raise BenchFailed(f"job {job_id}: no training command of learner {learner} found")


def equal_weights(first: Path, second: Path) -> bool:
    import torch

    ours: dict[str, torch.Tensor] = torch.load(first, weights_only=True)
    theirs: dict[str, torch.Tensor] = torch.load(second, weights_only=True)
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def say(progress: bool, text: str) -> None:
    if progress:
        print(f"bench ddp: {text}", file=sys.stderr, flush=True)


async def run(
    *,
    steps: int = 60,
    global_batch: int = 64,
    checkpoint_every: int = 10,
    step_seconds: float = 0.1,
    progress: bool = True,
) -> dict[str, Any]:
    settings = Settings(steps, global_batch, checkpoint_every, step_seconds)
    # Traversable by the learners' users (the agent's own folders are made 0711 within it).
    work = Path(tempfile.mkdtemp(prefix="trainyard-bench-ddp-"))
    os.chmod(work, 0o711)
    node = Node(work)
    try:
        await node.start()
        return await _measure(node, settings, progress)
    finally:
        await node.stop()
        shutil.rmtree(work, ignore_errors=True)


async def _measure(node: Node, settings: Settings, progress: bool) -> dict[str, Any]:
    say(progress, "one learner, uninterrupted")
    alone = await node.completed(node.submit(settings.command(paced=False), 1))
    say(progress, "two learners, uninterrupted")
    pair = await node.completed(node.submit(settings.command(paced=False), 2))
    deploying = next(
        t.at for t in pair.transitions if t.state is JobStatus.DEPLOYING and t.attempt == 1
    )
    ready = ready_lines(node, pair.job_id, 1)
    if len(ready) != 2:
        raise BenchFailed(f"job {pair.job_id}: {len(ready)} rank(s) said their group was ready")

    say(progress, "two learners, rank 1 killed halfway")
    every = settings.checkpoint_every
    # Halfway between two checkpoints, past the first: the steps since the last are lost.
    checkpoint = max(every, settings.steps // 2 // every * every)
    kill_at = checkpoint + every // 2
    if kill_at >= settings.steps:
        raise BenchFailed(f"{settings.steps} steps leave no step to kill at after {checkpoint}")
    crashed = node.submit(settings.command(paced=True), 2)
    await node.until(
        crashed,
        lambda job: job.last_checkpoint is not None and job.last_checkpoint.step >= checkpoint,
        f"a checkpoint of step {checkpoint}",
    )
    await node.until(crashed, lambda _: logged_step(node, crashed) >= kill_at, f"step {kill_at}")
    os.kill(training_command(crashed, 1), signal.SIGKILL)
    killed_at = time.monotonic()
    while processes_of(crashed, 1):
        if time.monotonic() - killed_at > 60:
            raise BenchFailed(f"job {crashed}: attempt 1 still runs 60 s after rank 1's kill")
        await asyncio.sleep(POLL_S)
    stopped_s = time.monotonic() - killed_at
    resumed = await node.completed(crashed)
    messages = [(line.attempt, protocol.parse(line.text)) for line in node.port.lines(crashed)]
    reached = max(m.step for a, m in messages if a == 1 and isinstance(m, protocol.Metric))
    restored = [
        m.step for a, m in messages if a == 2 and isinstance(m, protocol.CheckpointRestored)
    ]
    if resumed.attempt != 2 or len(restored) != 1:
        raise BenchFailed(f"job {crashed}: attempt {resumed.attempt}, restored {restored}")

    one, two = steps_per_s(node, alone.job_id), steps_per_s(node, pair.job_id)
    return {
        "rendezvous_s": round(max(at for at, _ in ready).timestamp() - deploying.timestamp(), 3),
        "rendezvous_wait_s": round(max(waited for _, waited in ready), 3),
        "rank_failure_stop_s": round(stopped_s, 3),
        "resume_exact": int(equal_weights(node.weights_path(resumed), node.weights_path(pair))),
        "lost_steps": reached - restored[0],
        "restarts": resumed.restarts,
        "scaling_efficiency": round(two / one / 2, 3),
        "steps_per_s": {"one_learner": round(one, 2), "two_learners": round(two, 2)},
        "cores": os.cpu_count(),
        "sandboxed": os.geteuid() == 0,
        "settings": {
            "steps": settings.steps,
            "global_batch": settings.global_batch,
            "checkpoint_every": settings.checkpoint_every,
            "step_seconds": settings.step_seconds,
            "killed_at_step": kill_at,
            "nodes": 1,
            "backend": "gloo",
        },
        "targets": TARGETS,
    }
