"""`trainyard bench ddp`: a job whose learners train together (issue 34), on one node or across
two.

Real agents (`bench.ddp_agents`): one on the agent port's in-memory twin, or (`nodes=2`, root
only) two acting as two nodes, each in a network namespace of its own, on a scratch database,
so that every job of two learners has one on each node and meets across them; running
`runners.examples.digits_ddp` (gloo, on the CPU, one thread a rank, a checkpoint by rank 0 every
`checkpoint_every` steps). Three jobs, one after the other, all with the same global batch and a
metric line every step:

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
  machine (on either node: both are this machine's); the job restarts both ranks from rank
  0's last checkpoint; `resume_exact` is 1 when its final weights equal (torch.equal) those of
  the uninterrupted two-learner job, else 0;
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

from bench.ddp_agents import (
    JOB_TIMEOUT_S,
    POLL_S,
    Agents,
    BenchFailed,
    OneAgent,
    TwoAgents,
    completed,
    until,
)
from bench.scratch import scratch_database
from controlplane.jobs.lifecycle import JobStatus
from controlplane.logs.lines import LogLine
from runners import protocol
from runners.distributed import READY_LINE

TARGETS = {
    "rendezvous_s": "<= 5",
    "rank_failure_stop_s": "<= 5",
    "resume_exact": "= 1",
    "lost_steps": "<= checkpoint_every",
}
_WAITED = re.compile(r" after ([0-9.]+) s$")


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


def ready_lines(lines: list[LogLine], attempt: int) -> list[tuple[datetime, float]]:
    """Each rank's line that its process group is formed: when it was written, and how long
    the rank waited in the rendezvous."""
    found = []
    for line in lines:
        if line.attempt == attempt and line.text.startswith(READY_LINE):
            waited = _WAITED.search(line.text)
            found.append((line.at, float(waited.group(1)) if waited else float("nan")))
    return found


def steps_per_s(lines: list[LogLine]) -> float:
    """Training steps a second between the first and the last metric line rank 0 wrote."""
    # Stamped by the learner as it wrote them (the agent reads its files every few hundredths
    # of a second, too coarse for steps of a few milliseconds).
    metrics = sorted(
        (message.at, message.step)
        for line in lines
        if isinstance(message := protocol.parse(line.text), protocol.Metric)
    )
    (first_at, first), (last_at, last) = metrics[0], metrics[-1]
    return (last - first) / (last_at - first_at).total_seconds()


def logged_step(lines: list[LogLine]) -> int:
    """The last step rank 0 logged (0 before any)."""
    steps = [
        message.step
        for line in lines
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
    nodes: int = 1,
    database: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """The figures; `nodes` 2 runs two agents as two nodes on a scratch database of the server
    of `database` (needs root, and a server the agents reach from their namespaces: a Unix
    socket, as the embedded one's)."""
    settings = Settings(steps, global_batch, checkpoint_every, step_seconds)
    # Traversable by the learners' users (the agent's own folders are made 0711 within it).
    work = Path(tempfile.mkdtemp(prefix="trainyard-bench-ddp-"))
    os.chmod(work, 0o711)
    try:
        if nodes == 1:
            async with OneAgent(work, os.cpu_count() or 2).running() as one:
                return await _measure(one, settings, progress)
        if database is None or os.geteuid() != 0:
            raise BenchFailed("two nodes need root (network namespaces) and a database")
        async with (
            scratch_database(database, "ddp") as scratch,
            TwoAgents(scratch, work).running() as two,
        ):
            return await _measure(two, settings, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _measure(agents: Agents, settings: Settings, progress: bool) -> dict[str, Any]:
    say(progress, "one learner, uninterrupted")
    alone = await completed(agents, await agents.submit(settings.command(paced=False), 1))
    say(progress, "two learners, uninterrupted")
    pair = await completed(agents, await agents.submit(settings.command(paced=False), 2))
    deploying = next(
        t.at for t in pair.transitions if t.state is JobStatus.DEPLOYING and t.attempt == 1
    )
    ready = ready_lines(await agents.lines(pair.job_id), 1)
    if len(ready) != 2:
        raise BenchFailed(f"job {pair.job_id}: {len(ready)} rank(s) said their group was ready")

    say(progress, "two learners, rank 1 killed halfway")
    every = settings.checkpoint_every
    # Halfway between two checkpoints, past the first: the steps since the last are lost.
    checkpoint = max(every, settings.steps // 2 // every * every)
    kill_at = checkpoint + every // 2
    if kill_at >= settings.steps:
        raise BenchFailed(f"{settings.steps} steps leave no step to kill at after {checkpoint}")
    crashed = await agents.submit(settings.command(paced=True), 2)
    await until(
        agents,
        crashed,
        lambda job: job.last_checkpoint is not None and job.last_checkpoint.step >= checkpoint,
        f"a checkpoint of step {checkpoint}",
    )
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while logged_step(await agents.lines(crashed)) < kill_at:
        if time.monotonic() > deadline:
            raise BenchFailed(f"job {crashed}: step {kill_at} not logged")
        await asyncio.sleep(POLL_S)
    os.kill(training_command(crashed, 1), signal.SIGKILL)
    killed_at = time.monotonic()
    while processes_of(crashed, 1):
        if time.monotonic() - killed_at > 60:
            raise BenchFailed(f"job {crashed}: attempt 1 still runs 60 s after rank 1's kill")
        await asyncio.sleep(POLL_S)
    stopped_s = time.monotonic() - killed_at
    resumed = await completed(agents, crashed)
    lines = await agents.lines(crashed)
    messages = [(line.attempt, protocol.parse(line.text)) for line in lines]
    reached = max(m.step for a, m in messages if a == 1 and isinstance(m, protocol.Metric))
    restored = [
        m.step for a, m in messages if a == 2 and isinstance(m, protocol.CheckpointRestored)
    ]
    if resumed.attempt != 2 or len(restored) != 1:
        # Why each attempt ended, and how the second one's log ends: a restart more than the
        # kill's is rare, and nothing else is left to tell why once the bench's folder goes.
        why = [
            f"{t.state} (attempt {t.attempt}): {t.reason}" for t in resumed.transitions if t.reason
        ]
        tail = [line.text for line in lines if line.attempt == 2][-8:]
        raise BenchFailed(
            f"job {crashed}: attempt {resumed.attempt}, restored {restored}; {'; '.join(why)}; "
            f"attempt 2's last lines: {tail}"
        )

    one = steps_per_s(await agents.lines(alone.job_id))
    two = steps_per_s(await agents.lines(pair.job_id))
    same = equal_weights(agents.weights_path(resumed), agents.weights_path(pair))
    return {
        "rendezvous_s": round(max(at for at, _ in ready).timestamp() - deploying.timestamp(), 3),
        "rendezvous_wait_s": round(max(waited for _, waited in ready), 3),
        "rank_failure_stop_s": round(stopped_s, 3),
        "resume_exact": int(same),
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
            "nodes": agents.nodes,
            "backend": "gloo",
        },
        "targets": TARGETS,
    }
