"""Running one claimed attempt: start its learners, ship their output, turn their reports into
job events, and end the attempt (completed, failed, cancelled or stopped) exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol
from uuid import UUID

from opentelemetry import propagate
from opentelemetry.util.types import Attributes

from controlplane.agent_port.support import TokenBucket, tracer
from controlplane.agent_port.vocabulary import (
    REPORT_BURST_S,
    SYSTEM_CLOCK,
    UNAVAILABLE,
    Claim,
    Clock,
    InvariantBroken,
    JobLimits,
    LearnerFailure,
    after_failure,
)
from controlplane.jobs.lifecycle import (
    Command,
    Complete,
    EnterPhase,
    Job,
    JobStatus,
    Restart,
    RollBack,
    SaveCheckpoint,
)
from node_agent.runtime import (
    CpuShare,
    ExitStatus,
    Learner,
    LearnerRuntime,
    LearnerSpec,
    LearnerStartError,
    Stream,
)
from runners import config as runner_env
from runners import protocol

log = logging.getLogger(__name__)

PHASES = (JobStatus.DOWNLOADING, JobStatus.PROCESSING, JobStatus.STORING)

LOGS_STORED_WITHIN_S = 60.0
"""How long an ending attempt waits for its learners' lines to be stored before its ending event
is appended all the same (with a line saying how many were still waiting)."""
LOGS_RETRY_S = 0.5
PREEMPTED = (
    "node agent stopped (preempted: its learners were asked to checkpoint; no restart spent)"
)


def drained(node: str) -> str:
    """Why a job went back to the queue when an operator drained its node."""
    return (
        f"node {node} drained by the operator (preempted: its learners were asked to "
        "checkpoint; no restart spent)"
    )


REPORTS_AHEAD = 16
"""How many of a learner's reports its lines' reading may run ahead of their events."""
FAILURE_GRACE_S = 2.0
"""After one learner failed, how long the others have between SIGTERM and SIGKILL (at most:
the agent's grace when that is shorter). Ranks of a process group cannot checkpoint without
the one that failed (a save is a collective), the attempt resumes from the last checkpoint, and
every rank must be stopped within 5 s of the failure, so that the restart comes soon."""


class LogSink(Protocol):
    """Where learner output goes (batched into Postgres by the log shipper)."""

    def add(
        self, spec: LearnerSpec, stream: Stream | str, text: str, at: datetime | None = None
    ) -> None: ...

    async def flush(self) -> None:
        """Store every line added so far; the database's error when it cannot."""
        ...

    def hurry(self) -> None:
        """Store the lines added so far soon, without waiting for the next batch."""
        ...

    def resume(self, spec: LearnerSpec, stream: str, stored_seq: int) -> None:
        """The learner's output is read again from its start: ship only after `stored_seq`."""
        ...

    async def open(self, job_id: UUID, attempt: int, limits: JobLimits) -> None:
        """The job's `attempt` runs here: hold its lines to `limits`; the database's error
        when it cannot read what the job has logged so far."""
        ...

    async def seal(self, job_id: UUID) -> None:
        """The job's attempt has ended: store its lines added so far (with markers for any
        dropped); the database's error when it cannot."""
        ...

    def unstored(self, job_id: UUID) -> int:
        """The job's lines added and not yet stored."""
        ...

    def close(self, job_id: UUID, attempt: int) -> None:
        """The job's `attempt` here is over: forget the job once its lines are stored and no
        other attempt of it runs here (a restart may claim the next one here while the last
        one's learners still end)."""
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
    read: asyncio.Event = field(default_factory=asyncio.Event)
    """All its lines are read, and added to the attempt's log."""
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
        adopted: Mapping[int, Learner] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.claim = claim
        self._clock = clock
        self._specs = specs
        self._runtime = runtime
        self._logs = logs
        self._execute = execute
        self._grace_s = grace_s
        self._adopted = dict(adopted or {})
        """Learners an earlier agent started, by index (the others are started here)."""
        self._learners: list[_LearnerState] = []
        # An adopted attempt may have reached a phase already: its learners' reports of it,
        # read again, must not report it twice.
        state = claim.job.state
        self._job_phase = PHASES.index(state) if state in PHASES else -1
        self._ending: str | None = None
        """Why the attempt is ending early: "failed", "cancelled", "stopped" or "fenced"."""
        self._preempted = PREEMPTED
        """Once stopped: the reason its job's history gives for going back to the queue."""
        self._first_failed: _LearnerState | None = None
        """The learner whose failure ended the attempt: the others' ends follow from it (a
        rank whose peer died fails too, or is stopped), and are not the reason."""
        self._terminating: asyncio.Task[None] | None = None
        self._job = claim.job
        self._number = claim.attempt
        self._indices = tuple(spec.learner for spec in specs)
        """This node's learners of the job (all of them, unless it runs on several nodes)."""
        rate = claim.job.limits.reports_per_s
        self._reports = TokenBucket.full(rate, max(1.0, rate * REPORT_BURST_S), time.monotonic())
        """Checkpoint reports become events at most at the job's rate: a learner printing
        forged or runaway reports cannot grow the job's stream without bound."""
        self._reports_dropped = 0
        self._lines = 0
        """The attempt's lines added so far: its learners' and its own."""
        self._sealed: int | None = None
        """How many of them the last storing of its lines (`_store_logs`) was given."""

    @property
    def specs(self) -> list[LearnerSpec]:
        """This node's learners of the attempt."""
        return self._specs

    @property
    def job_id(self) -> object:
        return self.claim.job.job_id

    async def run(self) -> None:
        """Until every learner has ended and the attempt's outcome is recorded: a span in the
        job's trace (after its claim's), the parent of the attempt's steps."""
        attributes: Attributes = {
            "trainyard.job.id": str(self.claim.job.job_id),
            "trainyard.job.attempt": self._number,
            "trainyard.learners": len(self._specs),
        }
        context = propagate.extract(self.claim.trace)
        with tracer.start_as_current_span("job.attempt", context=context, attributes=attributes):
            await self._run()

    async def _run(self) -> None:
        try:
            for spec in self._specs:
                learner = self._adopted.get(spec.learner) or await self._start(spec)
                self._learners.append(_LearnerState(spec, learner))
        except Exception as exc:
            # Whatever kept it from starting (a refused location, a folder it cannot have, an
            # engine's error, or a bug): the attempt ends here with the reason, never waits
            # for its deploy timeout.
            failed = self._specs[len(self._learners)]
            if not isinstance(exc, LearnerStartError):
                log.exception("job %s: learner %d failed to start", self.job_id, failed.learner)
            reason = f"learner {failed.learner} failed to start: {exc}"
            self._add(failed, "system", reason)
            # Whole or not at all: the learners started (here and on other nodes) are stopped
            # and the deployment tried again, or the job fails once its retries are spent.
            await self._terminate()
            await self._store_logs()
            await self._do(RollBack(reason=reason, at=self._clock.now(), attempt=self._number))
            return
        async with asyncio.TaskGroup() as group:
            for state in self._learners:
                group.create_task(self._follow(state))
            if self.claim.job.manifest.servable is None:
                # Its learners are the only writers of its lines (a replica's feed writes too,
                # until the attempt ends): they are stored as soon as the last is read, while
                # the reports among them still become events.
                group.create_task(self._store_logs_once_read())
            if self._ending is not None:
                # Ended (fenced, cancelled, stopped) while its learners were starting: the
                # termination begun then reached only those started by that time, and the
                # others would run on, holding the attempt and the agent's stop forever.
                await self._terminate()
        await self._finish()

    async def _start(self, spec: LearnerSpec) -> Learner:
        attributes: Attributes = {"trainyard.learner": spec.learner, "trainyard.gpus": spec.gpus}
        with tracer.start_as_current_span("learner.start", attributes=attributes):
            return await self._runtime.start(spec)

    def cancel(self) -> None:
        """The job was cancelled: stop the learners (its CANCELLED event is already written)."""
        self._end("cancelled")

    def stop(self, reason: str = PREEMPTED) -> None:
        """The agent is stopping, or its node was drained: stop the learners (they have the
        grace to checkpoint), and send the job back to the queue with `reason` (the first
        one given), spending no restart."""
        if self._ending is None:
            self._preempted = reason
        self._end("stopped")

    def fence(self) -> None:
        """The attempt is over without this node's say (restarted elsewhere, rolled back, or
        failed by a learner on another node): stop the learners and report nothing (any report
        would be stale)."""
        self._end("fenced")

    def _end(self, why: str) -> None:
        if self._ending is None:
            self._ending = why
        if self._terminating is None:
            grace = min(self._grace_s, FAILURE_GRACE_S) if why == "failed" else self._grace_s
            terminate = self._terminate(grace)
            self._terminating = asyncio.get_running_loop().create_task(terminate)

    def request_checkpoint(self) -> None:
        for state in self._learners:
            if state.status is None:
                state.learner.signal(signal.SIGUSR1)

    async def share_cpu(self, share: CpuShare) -> None:
        """Give this node's learners of the attempt `share` of its CPUs (a serving replica's,
        as it loads its model and once it has)."""
        for state in self._learners:
            await state.learner.share_cpu(share)

    async def remove_learners(self) -> None:
        """Remove what the ended learners leave behind; call once their lines are stored."""
        for state in self._learners:
            await state.learner.remove()

    async def wait_stopped(self) -> None:
        for state in self._learners:
            await state.done.wait()

    async def _follow(self, state: _LearnerState) -> None:
        # Its reports become events in order, while its lines are read on: the lines a learner
        # writes as it ends (STORING's) are all added, and stored, while the first of those
        # reports is still being recorded.
        reports: asyncio.Queue[protocol.Message | None] = asyncio.Queue(REPORTS_AHEAD)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._report(state, reports))
                async for stream, text, at in state.learner.lines():
                    self._add(state.spec, stream, text, at)
                    report = protocol.parse(text) if stream == "stdout" else None
                    if report is None:
                        continue
                    if isinstance(report, protocol.PhaseEnded) and report.phase == "STORING":
                        # The launcher's last line: its learner is ending. Its lines are stored
                        # while its sandbox is torn down, and the attempt's end, which waits
                        # for them (`_store_logs`), finds few or none left to write.
                        self._logs.hurry()
                    await reports.put(report)
                state.read.set()
                await reports.put(None)
                state.status = await state.learner.wait()
        finally:
            state.done.set()
        if not state.status.succeeded and self._ending is None:
            # One learner failed: the others cannot finish the job alone (and must not be
            # left running, holding their GPUs).
            self._first_failed = state
            self._end("failed")

    async def _report(
        self, state: _LearnerState, reports: asyncio.Queue[protocol.Message | None]
    ) -> None:
        """Turn the learner's reports into events, in order, until its lines end (None)."""
        while (report := await reports.get()) is not None:
            await self._on_report(state, report)

    def _add(
        self, spec: LearnerSpec, stream: Stream | str, text: str, at: datetime | None = None
    ) -> None:
        self._lines += 1
        self._logs.add(spec, stream, text, at)

    async def _on_report(self, state: _LearnerState, report: protocol.Message) -> None:
        match report:
            case protocol.PhaseStarted(phase=phase):
                state.phase = max(state.phase, PHASES.index(JobStatus(phase)))
                # The job is in a phase once every learner has reached it.
                reached = min(s.phase for s in self._learners)
                if reached > self._job_phase:
                    self._job_phase = reached
                    await self._do(
                        EnterPhase(
                            PHASES[reached],
                            at=report.at,
                            attempt=self._number,
                            learners=self._indices,
                        )
                    )
            case protocol.PhaseEnded(outcome="failed", error=error, signal=killed_by):
                state.error = error
                state.killed_by = killed_by
            case protocol.CheckpointSaved() if not self._recorded(report):
                if not _in_checkpoint_folder(state.spec, report.path):
                    self._add(
                        state.spec,
                        "system",
                        f"checkpoint report (step {report.step}) not recorded: its path "
                        f"{report.path[:300]!r} is not in the learner's checkpoint folder "
                        f"{state.spec.env[runner_env.CHECKPOINT_DIR]}",
                    )
                    return
                if self._reports.take(time.monotonic()):
                    self._drop_report(state, report)
                    return
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

    def _drop_report(self, state: _LearnerState, report: protocol.CheckpointSaved) -> None:
        """Not recorded, and said so in the job's log: the first time, then every 1000th."""
        self._reports_dropped += 1
        if self._reports_dropped % 1000 == 1:
            rate = self._reports.rate
            self._add(
                state.spec,
                "system",
                f"checkpoint report (step {report.step}) not recorded: this job's learners may "
                f"report {rate:g} per second (its reports_per_s limit); "
                f"{self._reports_dropped} not recorded so far in this attempt",
            )

    def _recorded(self, report: protocol.CheckpointSaved) -> bool:
        """Whether the checkpoint is on record already (an adopted learner's reports are read
        again from its start)."""
        last = self._job.last_checkpoint
        return last is not None and last.attempt == self._number and report.step <= last.step

    async def _store_logs_once_read(self) -> None:
        for state in self._learners:
            await state.read.wait()
        await self._store_logs()

    async def _store_logs(self) -> None:
        """Every line the attempt's learners wrote stored (or its loss marked) before the event
        that ends the attempt: whoever sees the job end, or restart, finds its whole log.
        Bounded: past LOGS_STORED_WITHIN_S the event goes on, after a line saying how many of
        the attempt's lines were still waiting (they follow later, the shipper keeps them)."""
        job_id = self.claim.job.job_id
        self._sealed = self._lines
        try:
            async with asyncio.timeout(LOGS_STORED_WITHIN_S):
                while True:
                    try:
                        await self._logs.seal(job_id)
                        return
                    except UNAVAILABLE as exc:
                        log.warning("job %s: storing its last lines failed (%s)", job_id, exc)
                        await asyncio.sleep(LOGS_RETRY_S)
        except TimeoutError:
            waiting = self._logs.unstored(job_id)
            log.error("job %s: attempt ends with %d log line(s) not stored", job_id, waiting)
            self._logs.add(
                self._specs[0],
                "system",
                f"[trainyard] attempt {self._number} ended with {waiting} log line(s) not yet "
                f"stored after {LOGS_STORED_WITHIN_S:.0f}s: they follow once the database "
                "takes them",
            )

    async def _finish(self) -> None:
        if self._sealed != self._lines:
            # Not stored yet (a replica's: its feed writes too), or added since (a report's).
            await self._store_logs()
        statuses = [s.status for s in self._learners]
        if self._ending in ("cancelled", "fenced"):
            return  # the job is CANCELLED already, or runs elsewhere now
        if self._ending == "stopped":
            # Preempted: its learners had the agent's grace to checkpoint (SIGTERM), and the
            # job resumes elsewhere, or here later, without spending a restart.
            preempted = Restart(
                reason=self._preempted,
                at=self._clock.now(),
                attempt=self._number,
                preempted=True,
            )
            await self._do(preempted)
            return
        failed = [s for s in self._learners if s.status is not None and not s.status.succeeded]
        if not failed:
            complete = Complete(
                exit_codes=[0] * len(statuses),
                at=self._clock.now(),
                attempt=self._number,
                learners=self._indices,
            )
            await self._do(complete)
            return
        first = self._first_failed or failed[0]
        if first.status is None:  # `failed` holds learners that exited
            raise InvariantBroken(f"attempt {self._number}: a failed learner without a status")
        killed_by = first.killed_by or first.status.signal
        failure = LearnerFailure(
            learner=first.spec.learner,
            description=f"killed by {killed_by}" if killed_by else first.status.describe(),
            exit_code=first.status.code,
            # Killed, or gone without a status while its agent was down: not the user's doing.
            infrastructure=killed_by is not None or first.status.oom_killed or first.status.unknown,
            error=first.error,
        )
        await self._do(after_failure(self._job, failure, self._clock.now()))

    async def _do(self, command: Command) -> None:
        """Carry out a job command, keeping the job's latest state (for the restart policy)."""
        job = await self._execute(command)
        if job is not None:
            self._job = job

    async def _terminate(self, grace_s: float | None = None) -> None:
        """SIGTERM (learners checkpoint on it), a grace period (the agent's, unless given),
        then SIGKILL."""
        running = [s for s in self._learners if s.status is None]
        for state in running:
            state.learner.signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._grace_s if grace_s is None else grace_s):
                for state in running:
                    await state.done.wait()
        for state in running:
            if not state.done.is_set():
                state.learner.signal(signal.SIGKILL)


def _in_checkpoint_folder(spec: LearnerSpec, path: str) -> bool:
    """Whether a reported checkpoint lies in the folder the learner was given for them (as a
    resume does, normalized, so that `..` cannot lead out): the path is the learner's word,
    recorded for the control plane to read back (a restart's resume, a model's publication)."""
    folder = Path(spec.env[runner_env.CHECKPOINT_DIR])
    return Path(os.path.normpath(path)).is_relative_to(folder)
