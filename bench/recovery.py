"""`trainyard bench recovery`: how long each part of Trainyard takes to recover from a crash, as
the DLaaS paper's Fig. 4 measures it for its services and learners, and IDunno for a worker and
its coordinator; with real processes (`harness.processes`) on a scratch database.

The cluster: a control plane process (`trainyard serve`), two node agents (`trainyard agent`,
process runtime, lease TTL LEASE_TTL_S, heartbeat every HEARTBEAT_S, one checkpoint directory
for both, as a shared volume) and their learners, `runners.examples.counter` (it prints a line
every few hundredths of a second and checkpoints every second with the runner's
`Checkpointer`). Every crash is a SIGKILL. Each figure is the median over `trials`; every trial
also checks that the recovery was the right one (the same learner, the right attempt, resumed
from the checkpoint on record), and the benchmark fails rather than report a figure for a
recovery that went wrong.

- control_plane_recovery_s: with a job running, the control plane is killed and, DOWN_S later,
  started again (same port). From the instant the new process is spawned until a job submitted
  to it once its /readyz answers 200 (database reachable, projections caught up, background
  tasks running) is seen entering PROCESSING through its SSE stream (`/v1/jobs/{id}/events`).
  So it counts the restart (interpreter, imports, catching up), the submit, the queue
  projection, an agent's claim and the learner's launcher starting its command.
  control_plane_ready_s: the part until /readyz answered 200. The running job must still be at
  attempt 1 afterwards (the crash cost it nothing).
- failover_s: a second replica runs as standby. The active manager's replica is killed and, at
  once, a node whose lease has already expired is registered. From the kill until the other
  replica has declared that node LOST: it found the lock free at its next try, took it, and
  swept an interval later (it does one or the other once per MANAGER_INTERVAL_S). The killed
  replica comes back as the standby and the next trial kills the other one; the kills are
  spread evenly over the standby's cycle.
- agent_recovery_s: a running job's agent is killed, and DOWN_S later started again (same work
  directory, so the same identity and lease). From the spawn until a log line that the learner
  printed after the spawn is stored: the agent has registered, re-adopted the learner, shipped
  its backlog and follows it live again. The learner must be the same process throughout, and
  its log must hold every line exactly once, with no gap in its numbering.
- learner_restart_s: a job's learner (launcher and training command) is killed after its first
  checkpoint. From the kill until its attempt 2 has entered PROCESSING (launcher started again),
  including the restart backoff the policy imposes on a first restart (learner_backoff_s, by
  design); learner_restart_excluding_backoff_s without it. learner_resumed_s: until attempt 2
  reported restoring the checkpoint that its JobRestarted event names (the training script's
  own start-up, torch's import included, is in it).
- node_loss_s: a running job's agent and learner are both killed, as when a machine dies. From
  the kill until the job's attempt 2 has entered PROCESSING on the other node: the lease expires
  (TTL after the last heartbeat), the active manager declares the node LOST (within its
  interval) and restarts the job without backoff, the other agent claims it.
  node_loss_detected_s: until the NodeLost event. Attempt 2 must restore the checkpoint on
  record (from the shared checkpoint directory).
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from bench.scratch import scratch_database
from controlplane.agents.events import NodeLost
from controlplane.agents.nodes import Nodes, NodeSpec, node_stream
from controlplane.database import create_pool
from controlplane.jobs.events import CheckpointSaved, JobProcessing, JobRestarted
from controlplane.jobs.images import DEFAULT_IMAGES
from controlplane.jobs.lifecycle import JobStatus
from harness.processes import Cluster, LogTail, cluster, counter, kill_learner, until
from harness.served import ServedControlPlane
from node_agent.learners import learner_dir
from node_agent.process_runtime import OUTPUT_FILES
from runners import protocol
from trainyard.api import ApiClient

LEASE_TTL_S = 3.0
HEARTBEAT_S = 0.5
MANAGER_INTERVAL_S = 1.0
"""The lifecycle manager's default `interval_s`, which `trainyard serve` runs it with."""
AGENT_POLL_S = 1.0
"""How often an agent looks for work when no NOTIFY wakes it: `AgentConfig.poll_s`'s default,
which `trainyard agent` runs with (it decides when a job's restart backoff has run out)."""
DOWN_S = 0.5
"""How long a killed control plane or agent stays down before it is started again."""
STEP_S = 0.02
"""The counter's step: its output lines come this often."""
LONG = 10_000_000
"""Steps of a job that runs until the benchmark cancels it."""
PROBE = {"name": "probe", "image": DEFAULT_IMAGES, "command": [sys.executable, "-c", "pass"]}

TARGETS_S = {
    "control_plane_recovery_s": 2.0,
    "failover_s": 5.0,
    "agent_recovery_s": 2.0,
    "learner_restart_s": 2.0,
    "node_loss_s": LEASE_TTL_S + 2.0,
}
REFERENCE_S = {
    "dlaas_fig4": {
        "api": [3, 5],
        "lcm": [4, 6],
        "guardian": [1, 2],
        "helper": [3, 4],
        "learner": [10, 20],
    },
    "idunno": {"worker_failure": 3.2, "coordinator_failover": 18.0},
}

Say = Callable[[str], None]
Samples = dict[str, list[float]]


async def run(url: str, *, trials: int, progress: bool = False) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr)

    samples: Samples = {}
    load_before = os.getloadavg()[0]
    async with scratch_database(url, "recovery") as database:
        pool = await create_pool(database, min_size=2, max_size=4)
        try:
            with tempfile.TemporaryDirectory(prefix="trainyard-recovery-") as root:
                # Passable by learners that run as users of their own (the agents are root).
                os.chmod(root, 0o711)
                async with cluster(database, Path(root), pool) as running:
                    await _measure(running, trials, samples, say)
        finally:
            await pool.close()
    return {
        "trials": trials,
        "lease_ttl_s": LEASE_TTL_S,
        "heartbeat_s": HEARTBEAT_S,
        "manager_interval_s": MANAGER_INTERVAL_S,
        "agent_poll_s": AGENT_POLL_S,
        "down_s": DOWN_S,
        # Every figure counts process start-ups: on a busy machine they are slower.
        "cpus": os.cpu_count(),
        "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]},
        **{name: _median(values) for name, values in samples.items()},
        "targets_s": TARGETS_S,
        "reference_s": REFERENCE_S,
        "per_trial_s": {name: [round(v, 3) for v in values] for name, values in samples.items()},
    }


async def _measure(running: Cluster, trials: int, samples: Samples, say: Say) -> None:
    plane = await running.add_plane()
    for _ in range(2):
        await running.add_agent(ttl_s=LEASE_TTL_S, heartbeat_s=HEARTBEAT_S)
    scenarios: list[tuple[str, Callable[[Cluster, ServedControlPlane, Samples], Awaitable[None]]]]
    scenarios = [
        ("control plane kill -9, restart", _control_plane),
        ("agent kill -9, restart", _agent),
        ("learner kill -9", _learner),
        ("node loss (agent and learner kill -9)", _node_loss),
    ]
    for title, scenario in scenarios:
        for trial in range(1, trials + 1):
            say(f"{title}: trial {trial}/{trials} ...")
            await scenario(running, plane, samples)
    say("manager failover between two replicas ...")
    await _failover(running, trials, samples)


def _add(samples: Samples, name: str, seconds: float) -> None:
    samples.setdefault(name, []).append(seconds)


async def _control_plane(running: Cluster, plane: ServedControlPlane, samples: Samples) -> None:
    busy = await running.submit(counter(LONG, STEP_S), plane)
    await running.job_event(busy, CheckpointSaved)  # started and training
    await plane.kill()
    await asyncio.sleep(DOWN_S)
    await plane.start()  # returns once /readyz says ready
    ready_s = since(plane.spawned_at)
    probe = await running.submit(PROBE, plane)
    async with (
        ApiClient(plane.url, running.token) as client,
        aclosing(client.follow(f"/v1/jobs/{probe}/events")) as events,
    ):
        async for message in events:
            if message.event == JobProcessing.type_name:
                break
    _add(samples, "control_plane_recovery_s", since(plane.spawned_at))
    _add(samples, "control_plane_ready_s", ready_s)
    job = await running.job(busy)
    if job.state is not JobStatus.PROCESSING or job.attempt != 1:
        raise RuntimeError(f"a running job was disturbed by the control plane's crash: {job}")
    await running.cancel(busy, plane)


async def _agent(running: Cluster, plane: ServedControlPlane, samples: Samples) -> None:
    job_id = await running.submit(counter(LONG, STEP_S), plane)
    await running.job_event(job_id, CheckpointSaved)  # started and training
    learner = await running.learner(job_id, attempt=1)
    agent = running.agents[(await running.job(job_id)).nodes[0]]
    await agent.kill()
    await asyncio.sleep(DOWN_S)
    # The learner's own output file tells what it had printed when the new agent started.
    printed = _last_step(learner_dir(agent.work_dir, job_id, 1, 0) / OUTPUT_FILES["stdout"])
    await agent.start(running.pool)
    tail = LogTail(running.pool, job_id, 1)

    async def shipping_live() -> bool | None:
        steps = [_step(line.text) for line in await tail.read()]
        return True if max(steps, default=0) > printed else None

    await until(shipping_live)
    _add(samples, "agent_recovery_s", since(agent.spawned_at))
    if [found.handle for found in running.learners(job_id)] != [learner.handle]:
        raise RuntimeError(f"job {job_id}: its learner was not re-adopted untouched")
    await running.cancel(job_id, plane)
    await _check_numbered_once(running, job_id)


async def _learner(running: Cluster, plane: ServedControlPlane, samples: Samples) -> None:
    job_id = await running.submit(counter(LONG, STEP_S), plane)
    await running.job_event(job_id, CheckpointSaved)
    learner = await running.learner(job_id, attempt=1)
    start = time.perf_counter()
    kill_learner(learner)
    await running.job_event(job_id, JobProcessing, lambda e: e.attempt == 2)
    restart_s = since(start)
    restarted = await running.job_event(job_id, JobRestarted)
    backoff_s = 0.0
    if restarted.not_before is not None:
        backoff_s = (restarted.not_before - restarted.at).total_seconds()
    await _until_restored(running, job_id, restarted)
    _add(samples, "learner_restart_s", restart_s)
    _add(samples, "learner_restart_excluding_backoff_s", restart_s - backoff_s)
    _add(samples, "learner_backoff_s", backoff_s)
    _add(samples, "learner_resumed_s", since(start))
    await running.cancel(job_id, plane)


async def _node_loss(running: Cluster, plane: ServedControlPlane, samples: Samples) -> None:
    job_id = await running.submit(counter(LONG, STEP_S), plane)
    await running.job_event(job_id, CheckpointSaved)
    learner = await running.learner(job_id, attempt=1)
    node = (await running.job(job_id)).nodes[0]
    agent = running.agents[node]
    start = time.perf_counter()
    killed_at = datetime.now(UTC)
    await agent.kill()
    kill_learner(learner)
    await running.job_event(job_id, JobProcessing, lambda e: e.attempt == 2)
    _add(samples, "node_loss_s", since(start))
    lost = await running.event(node_stream(node), NodeLost, lambda e: e.at > killed_at)
    _add(samples, "node_loss_detected_s", (lost.at - killed_at).total_seconds())
    moved = await running.job(job_id)
    if moved.attempt != 2 or node in moved.nodes:
        raise RuntimeError(f"job {job_id} did not move off lost node {node}: {moved}")
    await _until_restored(running, job_id, await running.job_event(job_id, JobRestarted))
    await agent.start(running.pool)  # the node rejoins, for the next trial
    await running.cancel(job_id, plane)


async def _failover(running: Cluster, trials: int, samples: Samples) -> None:
    active = running.planes[0]
    # Alone, it is surely the active manager: it acts on an expired lease.
    await _expired_node_declared_lost(running)
    standby = await running.add_plane()
    for trial in range(trials):
        # The standby tries the lock once an interval from its start, and it has just started:
        # the trials' crashes are spread evenly over that cycle, as real ones would fall.
        await asyncio.sleep((trial + 0.5) / trials * MANAGER_INTERVAL_S)
        start = time.perf_counter()
        await active.kill()
        await _expired_node_declared_lost(running)
        _add(samples, "failover_s", since(start))
        await active.start()
        active, standby = standby, active


async def _expired_node_declared_lost(running: Cluster) -> None:
    """Register a node whose lease expires at once (no agent behind it), and wait until the
    active manager has declared it LOST."""
    name = f"{running.prefix}-ghost-{uuid4().hex[:6]}"
    spec = NodeSpec(name, uuid4(), "process", 1.0, 1024, [])
    await Nodes(running.pool, running.store).register(spec, ttl_s=0.001)
    await running.event(node_stream(name), NodeLost)


async def _until_restored(running: Cluster, job_id: UUID, restarted: JobRestarted) -> None:
    """Until the restarted attempt reports restoring the checkpoint its restart names."""
    tail = LogTail(running.pool, job_id, restarted.attempt)

    async def restored() -> protocol.CheckpointRestored | None:
        for line in await tail.read():
            report = protocol.parse(line.text) if line.stream == "stdout" else None
            if isinstance(report, protocol.CheckpointRestored):
                return report
        return None

    report = await until(restored)
    if report.path != restarted.resume_from:
        raise RuntimeError(
            f"job {job_id} attempt {restarted.attempt} restored {report.path}, not the "
            f"checkpoint on record ({restarted.resume_from})"
        )


async def _check_numbered_once(running: Cluster, job_id: UUID) -> None:
    """The attempt's stdout: seqs 1..n, and the counter's lines 1..m, each exactly once."""
    stdout = [line for line in await running.lines(job_id, 1) if line.stream == "stdout"]
    seqs = [line.seq for line in stdout]
    steps = [step for line in stdout if (step := _step(line.text))]
    if seqs != list(range(1, len(seqs) + 1)) or steps != list(range(1, len(steps) + 1)):
        raise RuntimeError(f"job {job_id}: its log has a gap or a repeated line")


def since(start: float) -> float:
    """Seconds from `start` (a `time.perf_counter()`) until now."""
    return time.perf_counter() - start


def _step(text: str) -> int:
    """N of the counter's `step N` line; 0 for any other line."""
    word, _, number = text.partition(" ")
    return int(number) if word == "step" and number.isdigit() else 0


def _last_step(stdout: Path) -> int:
    return max((_step(text) for text in stdout.read_text().splitlines()), default=0)


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)
