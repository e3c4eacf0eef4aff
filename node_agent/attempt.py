"""Running one claimed attempt: start its learners, ship their output, turn their reports into
job events, and end the attempt (completed, failed, cancelled or stopped) exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from controlplane.agents.claims import Claim
from controlplane.jobs.lifecycle import (
    Command,
    Complete,
    EnterPhase,
    Fail,
    Job,
    JobStatus,
    Restart,
    SaveCheckpoint,
)
from controlplane.jobs.restarts import LearnerFailure, after_failure
from controlplane.jobs.service import now
from node_agent.runtime import (
    ExitStatus,
    Learner,
    LearnerRuntime,
    LearnerSpec,
    LearnerStartError,
    Stream,
)
from runners import protocol

log = logging.getLogger(__name__)

PHASES = (JobStatus.DOWNLOADING, JobStatus.PROCESSING, JobStatus.STORING)


class LogSink(Protocol):
    """Where learner output goes (batched into Postgres by the log shipper)."""

    def add(
        self, spec: LearnerSpec, stream: Stream | str, text: str, at: datetime | None = None
    ) -> None: ...

    async def flush(self) -> None:
        """Store every line added so far; the database's error when it cannot."""
        ...


Execute = Callable[[Command], Awaitable[Job | None]]
"""Carries out a job command for this attempt (retrying while the database is away); None when
the job refused it (cancelled meanwhile, say)."""


@dataclass
class _LearnerState:
    spec: LearnerSpec
    learner: Learner
    phase: int = -1
    """Index into PHASES of the furthest phase this learner has started."""
    error: str | None = None
    killed_by: str | None = None
    """The signal that killed the training command, as its launcher reported it."""
    status: ExitStatus | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Attempt:
    def __init__(
        self,
        claim: Claim,
        specs: list[LearnerSpec],
        runtime: LearnerRuntime,
        logs: LogSink,
        execute: Execute,
        *,
        grace_s: float,
    ) -> None:
        self.claim = claim
        self._specs = specs
        self._runtime = runtime
        self._logs = logs
        self._execute = execute
        self._grace_s = grace_s
        self._learners: list[_LearnerState] = []
        self._job_phase = -1
        self._ending: str | None = None
        """Why the attempt is ending early: "failed", "cancelled", "stopped" or "fenced"."""
        self._terminating: asyncio.Task[None] | None = None
        self._job = claim.job
        self._number = claim.attempt

    @property
    def job_id(self) -> object:
        return self.claim.job.job_id

    async def run(self) -> None:
        """Until every learner has ended and the attempt's outcome is recorded."""
        try:
            for spec in self._specs:
                self._learners.append(_LearnerState(spec, await self._runtime.start(spec)))
        except LearnerStartError as exc:
            failed = self._specs[len(self._learners)]
            reason = f"learner {failed.learner} failed to start: {exc}"
            self._logs.add(failed, "system", reason)
            await self._terminate()
            await self._do(Fail(reason=reason, at=now(), attempt=self._number))
            return
        async with asyncio.TaskGroup() as group:
            for state in self._learners:
                group.create_task(self._follow(state))
        await self._finish()

    def cancel(self) -> None:
        """The job was cancelled: stop the learners (its CANCELLED event is already written)."""
        self._end("cancelled")

    def stop(self) -> None:
        """The agent is stopping: stop the learners, and send the job back to the queue."""
        self._end("stopped")

    def fence(self) -> None:
        """This node lost its lease: the attempt was restarted elsewhere; stop the learners and
        report nothing (any report would be stale)."""
        self._end("fenced")

    def _end(self, why: str) -> None:
        if self._ending is None:
            self._ending = why
        if self._terminating is None:
            self._terminating = asyncio.get_running_loop().create_task(self._terminate())

    def request_checkpoint(self) -> None:
        for state in self._learners:
            if state.status is None:
                state.learner.signal(signal.SIGUSR1)

    async def remove_learners(self) -> None:
        """Remove what the ended learners leave behind; call once their lines are stored."""
        for state in self._learners:
            await state.learner.remove()

    async def wait_stopped(self) -> None:
        for state in self._learners:
            await state.done.wait()

    async def _follow(self, state: _LearnerState) -> None:
        try:
            async for stream, text, at in state.learner.lines():
                self._logs.add(state.spec, stream, text, at)
                report = protocol.parse(text) if stream == "stdout" else None
                if report is not None:
                    await self._on_report(state, report)
            state.status = await state.learner.wait()
        finally:
            state.done.set()
        if not state.status.succeeded and self._ending is None:
            # One learner failed: the others cannot finish the job alone (and must not be
            # left running, holding their GPUs).
            self._end("failed")

    async def _on_report(self, state: _LearnerState, report: protocol.Message) -> None:
        match report:
            case protocol.PhaseStarted(phase=phase):
                state.phase = max(state.phase, PHASES.index(JobStatus(phase)))
                # The job is in a phase once every learner has reached it.
                reached = min(s.phase for s in self._learners)
                if reached > self._job_phase:
                    self._job_phase = reached
                    await self._do(EnterPhase(PHASES[reached], at=report.at, attempt=self._number))
            case protocol.PhaseEnded(outcome="failed", error=error, signal=killed_by):
                state.error = error
                state.killed_by = killed_by
            case protocol.CheckpointSaved():
                await self._do(
                    SaveCheckpoint(
                        step=report.step,
                        path=report.path,
                        size_bytes=report.size_bytes,
                        duration_s=report.duration_s,
                        at=report.at,
                        attempt=self._number,
                    )
                )

    async def _finish(self) -> None:
        statuses = [s.status for s in self._learners]
        if self._ending in ("cancelled", "fenced"):
            return  # the job is CANCELLED already, or runs elsewhere now
        if self._ending == "stopped":
            await self._do(Restart(reason="node agent stopped", at=now(), attempt=self._number))
            return
        failed = [s for s in self._learners if s.status is not None and not s.status.succeeded]
        if not failed:
            await self._do(Complete(exit_codes=[0] * len(statuses), at=now(), attempt=self._number))
            return
        first = failed[0]
        assert first.status is not None
        killed_by = first.killed_by or first.status.signal
        failure = LearnerFailure(
            learner=first.spec.learner,
            description=f"killed by {killed_by}" if killed_by else first.status.describe(),
            exit_code=first.status.code,
            infrastructure=killed_by is not None or first.status.oom_killed,
            error=first.error,
        )
        await self._do(after_failure(self._job, failure, now()))

    async def _do(self, command: Command) -> None:
        """Carry out a job command, keeping the job's latest state (for the restart policy)."""
        job = await self._execute(command)
        if job is not None:
            self._job = job

    async def _terminate(self) -> None:
        """SIGTERM (learners checkpoint on it), a grace period, then SIGKILL."""
        running = [s for s in self._learners if s.status is None]
        for state in running:
            state.learner.signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._grace_s):
                for state in running:
                    await state.done.wait()
        for state in running:
            if not state.done.is_set():
                state.learner.signal(signal.SIGKILL)
