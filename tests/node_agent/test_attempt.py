"""An attempt ended while its learners are still starting: real learner processes (the process
runtime), whose second start is held at a gate until the attempt has been ended."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from controlplane.clock import SYSTEM_CLOCK
from controlplane.jobs.lifecycle import (
    Command,
    Complete,
    EnterPhase,
    Job,
    JobStatus,
    Restart,
    Submit,
    decide,
    replay,
)
from controlplane.jobs.limits import JobLimits
from controlplane.jobs.manifest import JobManifest
from controlplane.scheduling.claim import Claim
from controlplane.scheduling.placement import LearnerAllocation
from node_agent.attempt import Attempt, Execute, LogSink
from node_agent.learners import learner_dir
from node_agent.process_runtime import ProcessRuntime, find_learners
from node_agent.runtime import (
    CpuShare,
    ExitStatus,
    Folder,
    FoundLearner,
    Learner,
    LearnerLine,
    LearnerSpec,
    Stream,
)
from tests.cluster import learner_space
from tests.node_agent.test_agent import SIGNALLED

pytestmark = pytest.mark.processes

LEARNER_UID = 200987
"""The job's user, when the test runs as root (tenants' code never runs as root)."""
NODE = "n-attempt"
ENDS_WITHIN_S = 20.0
"""Far longer than starting and terminating two learners takes; an attempt whose learner runs
on would wait forever."""


class Watched:
    """A started learner, and the signals the attempt sent it."""

    def __init__(self, learner: Learner) -> None:
        self._learner = learner
        self.signals: list[signal.Signals] = []
        self.terminated = asyncio.Event()

    def lines(self) -> AsyncIterator[LearnerLine]:
        return self._learner.lines()

    async def wait(self) -> ExitStatus:
        return await self._learner.wait()

    def signal(self, sig: signal.Signals) -> None:
        self.signals.append(sig)
        if sig is signal.SIGTERM:
            self.terminated.set()
        self._learner.signal(sig)

    async def remove(self) -> None:
        await self._learner.remove()

    async def share_cpu(self, share: CpuShare) -> None:
        await self._learner.share_cpu(share)


class GatedRuntime:
    """The process runtime, but the start of learner `gated` waits for `gate` to open."""

    name = "process"

    def __init__(self, work_dir: Path, gated: int) -> None:
        self._runtime = ProcessRuntime(work_dir)
        self._gated = gated
        self.waiting = asyncio.Event()
        """The gated learner's start has begun, and waits at the gate."""
        self.gate = asyncio.Event()
        self.started: dict[int, Watched] = {}

    async def start(self, spec: LearnerSpec) -> Learner:
        if spec.learner == self._gated:
            self.waiting.set()
            await self.gate.wait()
        learner = Watched(await self._runtime.start(spec))
        self.started[spec.learner] = learner
        return learner

    async def find(self, node: str) -> list[FoundLearner]:
        return await self._runtime.find(node)

    async def adopt(self, spec: LearnerSpec, found: FoundLearner | None) -> Learner | None:
        return await self._runtime.adopt(spec, found)

    async def kill(self, found: FoundLearner) -> None:
        await self._runtime.kill(found)


class Lines:
    """A log sink that keeps the learners' lines in memory (no database: the attempt's
    lines are not what this test is about)."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str, str]] = []
        self.hurried: list[int] = []
        """How many lines it held each time it was hurried."""

    def add(
        self, spec: LearnerSpec, stream: Stream | str, text: str, at: datetime | None = None
    ) -> None:
        self.lines.append((spec.learner, stream, text))

    async def flush(self) -> None:
        pass

    def hurry(self) -> None:
        self.hurried.append(len(self.lines))

    def resume(self, spec: LearnerSpec, stream: str, stored_seq: int) -> None:
        pass

    async def open(self, job_id: UUID, attempt: int, limits: JobLimits) -> None:
        pass

    async def seal(self, job_id: UUID) -> None:
        pass

    def unstored(self, job_id: UUID) -> int:
        return 0

    def close(self, job_id: UUID, attempt: int) -> None:
        pass


def deploying(learners: int) -> Claim:
    """Attempt 1 of a job of `learners` learners, all of them on NODE."""
    manifest = JobManifest.model_validate(
        {"name": "j", "image": "i", "command": ["train"], "learners": learners}
    )
    submit = Submit(job_id=uuid4(), tenant="t", manifest=manifest, at=SYSTEM_CLOCK.now())
    job = replay(decide(submit, None))
    assert job is not None
    job = job.model_copy(update={"state": JobStatus.DEPLOYING, "attempt": 1})
    placed = [LearnerAllocation(index, NODE, []) for index in range(learners)]
    return Claim(job, 1, epoch=1, learners=placed, version=2)


def learner(work_dir: Path, claim: Claim, index: int) -> LearnerSpec:
    """A learner that runs until SIGTERM (see SIGNALLED)."""
    workdir = learner_dir(work_dir, claim.job.job_id, claim.attempt, index)
    return LearnerSpec(
        job_id=claim.job.job_id,
        attempt=claim.attempt,
        learner=index,
        epoch=claim.epoch,
        node=NODE,
        image="unused",
        command=[sys.executable, "-c", SIGNALLED],
        env={},
        workdir=workdir,
        folders=[Folder(work_dir, workdir)],
        user=(LEARNER_UID, LEARNER_UID) if os.geteuid() == 0 else None,
        gpus=[],
        cpus=1,
        memory_mb=4096,
    )


@pytest.mark.parametrize(
    "end",
    [Attempt.fence, Attempt.cancel, Attempt.stop],
    ids=["fenced", "cancelled", "stopped"],
)
async def test_an_attempt_ended_while_its_learners_start_terminates_those_started_after(
    end: Callable[[Attempt], None],
) -> None:
    """Learner 0 has started and learner 1 is starting when the attempt is ended: the
    termination begun then reaches learner 0 only. Learner 1, started after it, must be
    terminated too: it used to run on, and the attempt (and with it the agent's stop) waited
    for it forever (the gang rollback test's intermittent hang; fixed in 56dd060)."""
    work_dir = learner_space()
    claim = deploying(2)
    runtime = GatedRuntime(work_dir, gated=1)
    commands: list[Command] = []

    async def execute(command: Command) -> Job | None:
        commands.append(command)
        return None

    specs = [learner(work_dir, claim, index) for index in range(2)]
    attempt = Attempt(claim, specs, runtime, Lines(), execute, grace_s=ENDS_WITHIN_S)
    running = asyncio.create_task(attempt.run())
    try:
        async with asyncio.timeout(ENDS_WITHIN_S):
            await runtime.waiting.wait()  # learner 0 has started, learner 1 is starting
            end(attempt)
            await runtime.started[0].terminated.wait()  # the termination begun reached it
            runtime.gate.set()  # learner 1 starts now, after it
            await running
        # Taken before the clean-up below kills whatever would run on.
        sent = {index: list(watched.signals) for index, watched in runtime.started.items()}
        left_running = find_learners(NODE, work_dir)
    except TimeoutError:
        sent = {index: watched.signals for index, watched in runtime.started.items()}
        pytest.fail(
            f"the attempt did not end within {ENDS_WITHIN_S:.0f}s "
            f"(signals sent: {sent}; commands: {commands})"
        )
    finally:
        # Nothing outlives the test, even a failed one.
        running.cancel()
        for watched in runtime.started.values():
            watched.signal(signal.SIGKILL)
            await asyncio.wait_for(watched.wait(), 10)
        await asyncio.wait({running}, timeout=10)

    # Both learners were started, and each was terminated: none runs on.
    assert sorted(sent) == [0, 1]
    assert all(signal.SIGTERM in signals for signals in sent.values()), sent
    assert left_running == []
    # Ended, not failed: an ended attempt reports nothing but the agent's stop.
    stopped = [c for c in commands if isinstance(c, Restart)]
    assert len(commands) == len(stopped) == (1 if end is Attempt.stop else 0)


ENDING = """
from runners.channel import STDOUT, now
from runners.protocol import PhaseStarted
for phase in ("DOWNLOADING", "PROCESSING", "STORING"):
    STDOUT.emit(PhaseStarted(phase=phase, at=now()))
print("last words", flush=True)
"""
"""A learner that reports its phases, writes a last line and ends."""


LAST_REPORT = """
import time
from runners.channel import STDOUT, now
from runners.protocol import PhaseEnded, PhaseStarted
for phase in ("DOWNLOADING", "PROCESSING", "STORING"):
    STDOUT.emit(PhaseStarted(phase=phase, at=now()))
print("results stored", flush=True)
STDOUT.emit(PhaseEnded(phase="STORING", outcome="succeeded", duration_s=0.0, at=now()))
time.sleep(0.3)
"""
"""A learner whose launcher's last line ends STORING, then takes a moment to end."""


class SealedLines(Lines):
    """The in-memory sink, which also says how many lines it held each time it was sealed."""

    def __init__(self) -> None:
        super().__init__()
        self.sealed: list[int] = []
        self.sealing = asyncio.Event()

    async def seal(self, job_id: UUID) -> None:
        self.sealed.append(len(self.lines))
        self.sealing.set()


async def run_alone(code: str, sink: LogSink, execute: Execute) -> None:
    """An attempt of one learner running `code`, run to its end (TimeoutError past
    ENDS_WITHIN_S), its learner removed after."""
    work_dir = learner_space()
    claim = deploying(1)
    spec = replace(learner(work_dir, claim, 0), command=[sys.executable, "-c", code])
    attempt = Attempt(claim, [spec], ProcessRuntime(work_dir), sink, execute, grace_s=1)
    try:
        async with asyncio.timeout(ENDS_WITHIN_S):
            await attempt.run()
    finally:
        await attempt.remove_learners()


async def test_a_learner_s_last_lines_are_stored_while_its_last_report_is_recorded() -> None:
    """STORING's event is being recorded as the learner ends: its last lines are read on and
    stored meanwhile, not after (the two waited on each other, a database round trip each,
    between a trial's end and its completion); the attempt ends only once both are done."""
    sink = SealedLines()
    commands: list[Command] = []
    lines_when_completed: list[int] = []

    async def execute(command: Command) -> Job | None:
        commands.append(command)
        if isinstance(command, EnterPhase) and command.phase is JobStatus.STORING:
            # Recorded only once the lines are stored: stored after it, they never would be.
            await sink.sealing.wait()
        if isinstance(command, Complete):
            lines_when_completed.append(len(sink.lines))
        return None

    try:
        await run_alone(ENDING, sink, execute)
    except TimeoutError:
        pytest.fail(f"the attempt did not end: its lines were never stored ({commands})")
    phases = [c.phase for c in commands if isinstance(c, EnterPhase)]
    assert phases == [JobStatus.DOWNLOADING, JobStatus.PROCESSING, JobStatus.STORING]
    assert isinstance(commands[-1], Complete)
    assert (0, "stdout", "last words") in sink.lines
    # Every line was stored before the attempt's end was recorded, once.
    assert sink.sealed == lines_when_completed == [len(sink.lines)]


async def test_a_learner_s_last_report_hurries_its_lines_to_storage_before_it_has_ended() -> None:
    """Its launcher's last line (STORING ended) says the learner is ending: its lines are
    stored while it ends, so that its attempt's end waits for no write of them."""
    sink = SealedLines()

    async def execute(command: Command) -> Job | None:
        return None

    await run_alone(LAST_REPORT, sink, execute)
    # Once, holding every line: the report that hurried it was the learner's last.
    assert sink.hurried == sink.sealed == [len(sink.lines)]
    assert (0, "stdout", "results stored") in sink.lines
