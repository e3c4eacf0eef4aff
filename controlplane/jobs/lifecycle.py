"""A job's lifecycle as pure functions: `decide` turns a command and the job's past events into
new events (or a refusal), `evolve` folds events into the job's state. No I/O here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, field_validator

from controlplane.events.commands import Aggregate
from controlplane.jobs.events import (
    CheckpointRequested,
    CheckpointSaved,
    DeploymentRolledBack,
    JobCancelled,
    JobCompleted,
    JobDeploying,
    JobDownloading,
    JobEvent,
    JobFailed,
    JobProcessing,
    JobRestarted,
    JobStoring,
    JobSubmitted,
    LearnersExited,
    LearnersReachedPhase,
)
from controlplane.jobs.limits import JobLimits
from controlplane.jobs.manifest import JobManifest, stored_manifest
from controlplane.jobs.streams import job_id_of


class JobStatus(StrEnum):
    QUEUED = "QUEUED"
    DEPLOYING = "DEPLOYING"
    DOWNLOADING = "DOWNLOADING"
    PROCESSING = "PROCESSING"
    STORING = "STORING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def running(self) -> bool:
        return self in RUNNING


TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
RUNNING = frozenset(
    {JobStatus.DEPLOYING, JobStatus.DOWNLOADING, JobStatus.PROCESSING, JobStatus.STORING}
)

# The phase a running job may move to next; a phase may be skipped (no data to download, no
# results to store), never revisited within one attempt.
_PHASES = [JobStatus.DEPLOYING, JobStatus.DOWNLOADING, JobStatus.PROCESSING, JobStatus.STORING]
_PHASE_EVENTS: dict[JobStatus, type[JobDownloading | JobProcessing | JobStoring]] = {
    JobStatus.DOWNLOADING: JobDownloading,
    JobStatus.PROCESSING: JobProcessing,
    JobStatus.STORING: JobStoring,
}


class Checkpoint(BaseModel):
    model_config = ConfigDict(frozen=True)

    attempt: int
    step: int
    path: str
    size_bytes: int
    at: datetime


class Transition(BaseModel):
    model_config = ConfigDict(frozen=True)

    state: JobStatus
    at: datetime
    attempt: int
    reason: str | None = None


class Job(BaseModel):
    """A job's state, folded from its events."""

    model_config = ConfigDict(frozen=True)

    job_id: UUID
    tenant: str
    manifest: JobManifest
    limits: JobLimits = Field(default_factory=JobLimits)
    state: JobStatus
    attempt: int
    restarts: int
    submitted_at: datetime
    updated_at: datetime
    nodes: list[str] = Field(default_factory=list)
    gpus: list[str] = Field(default_factory=list)
    learner_nodes: list[str] = Field(default_factory=list)
    """The current attempt's node of each learner, by learner index (empty while it is not
    placed, and for attempts placed before it was recorded)."""
    epoch: int | None = None
    last_checkpoint: Checkpoint | None = None
    checkpoint_requested_at: datetime | None = None
    not_before: datetime | None = None
    """A restarted job waits (backoff) until this instant before it may be claimed."""
    exit_codes: list[int] = Field(default_factory=list)
    failure_reason: str | None = None
    rollbacks: int = 0
    """Deployments of the job rolled back so far."""
    learner_phases: dict[int, JobStatus] = Field(default_factory=dict)
    """Learners of this attempt already in a phase the job has not entered yet (waiting for
    learners on other nodes)."""
    exited: list[int] = Field(default_factory=list)
    """Learners of this attempt that exited 0 while others still run."""
    transitions: list[Transition] = Field(default_factory=list)
    """Every state entered, with its time: the job's history."""

    @field_validator("manifest", mode="before")
    @classmethod
    def _as_stored_today(cls, value: Any) -> Any:
        # A stored state (the jobs projection, the claim queue) folded before reserved names
        # were refused, or before today's floors, may hold them, as JobSubmitted versions 1
        # and 2 may: read the same way.
        return stored_manifest(value) if isinstance(value, dict) else value


class Refused(Exception):
    """A command that is illegal in the job's current state; nothing is written."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


# Commands: what callers ask for. Each carries the instant it is decided at.


@dataclass(frozen=True, slots=True)
class Submit:
    job_id: UUID
    tenant: str
    manifest: JobManifest
    at: datetime
    limits: JobLimits = field(default_factory=JobLimits)


@dataclass(frozen=True, slots=True)
class Deploy:
    nodes: list[str]
    gpus: list[str]
    epoch: int
    at: datetime
    learner_nodes: list[str] = field(default_factory=list)
    """The node of each learner, by learner index (the claims give it)."""


@dataclass(frozen=True, slots=True)
class EnterPhase:
    phase: JobStatus
    at: datetime
    attempt: int | None = None
    learners: tuple[int, ...] | None = None
    """The learners that reached the phase (an agent runs those of its node); None: all."""


@dataclass(frozen=True, slots=True)
class Complete:
    exit_codes: list[int]
    at: datetime
    attempt: int | None = None
    learners: tuple[int, ...] | None = None
    """The learners that exited (with `exit_codes`, in this order); None: all."""


@dataclass(frozen=True, slots=True)
class RollBack:
    """Not every learner started (in time): deploy the job again, or fail it after
    `deploy_retries` rollbacks."""

    reason: str
    at: datetime
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    reason: str
    at: datetime
    exit_code: int | None = None
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class Restart:
    reason: str
    at: datetime
    backoff_s: float = 0.0
    """How long the new attempt waits before it may be claimed."""
    attempt: int | None = None
    preempted: bool = False
    """Stopped by its agent's stop (a drain, a SIGTERM), its learners asked to checkpoint
    first, not by a failure: it spends no restart (`max_restarts`)."""


@dataclass(frozen=True, slots=True)
class RequestCheckpoint:
    at: datetime


@dataclass(frozen=True, slots=True)
class SaveCheckpoint:
    step: int
    path: str
    size_bytes: int
    duration_s: float
    at: datetime
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class StartQueries:
    """An inference job's first query started, on its deployment's replicas: holding no node
    of its own, it goes from QUEUED to PROCESSING directly."""

    at: datetime


Command = (
    Submit
    | Deploy
    | EnterPhase
    | Complete
    | Fail
    | Cancel
    | Restart
    | RequestCheckpoint
    | SaveCheckpoint
    | RollBack
    | StartQueries
)


def decide(command: Command, job: Job | None) -> list[JobEvent]:
    """The events that carry out `command` on `job` (None: not submitted), or Refused."""
    if isinstance(command, Submit):
        if job is not None:
            raise Refused(f"job {command.job_id} already exists (it is {job.state})")
        return [
            JobSubmitted(
                job_id=command.job_id,
                tenant=command.tenant,
                manifest=command.manifest,
                limits=command.limits,
                at=command.at,
            )
        ]
    if job is None:
        raise Refused("no such job", not_found=True)
    if job.state.terminal:
        raise Refused(f"job {job.job_id} is {job.state}; a finished job cannot change")
    return _decide_live(command, job)


# Commands that report on one attempt (from its agent): `attempt` fences off late reports.
_ATTEMPT_REPORTS = (EnterPhase, Complete, Fail, Restart, RollBack, SaveCheckpoint)


def _decide_live(command: Command, job: Job) -> list[JobEvent]:
    if isinstance(command, _ATTEMPT_REPORTS) and command.attempt not in (None, job.attempt):
        raise Refused(
            f"job {job.job_id} is {job.state} at attempt {job.attempt}; a report from attempt "
            f"{command.attempt} is stale (that attempt was restarted or reassigned)"
        )
    match command:
        case Deploy(nodes, gpus, epoch, at, learner_nodes):
            _require(job, {JobStatus.QUEUED}, "deploy")
            deploying = JobDeploying(
                attempt=job.attempt,
                nodes=nodes,
                gpus=gpus,
                epoch=epoch,
                learner_nodes=learner_nodes,
                at=at,
            )
            return [deploying]
        case EnterPhase(phase, at, _, learners):
            return _enter_phase(job, phase, at, learners)
        case Complete(exit_codes, at, _, learners):
            if job.state is JobStatus.DEPLOYING and learners is not None:
                # One node's learners, done before the others' (on other nodes) started: the
                # job waits for those still, but these started (a phase of theirs is recorded)
                # and ended; refused, their news was lost and the job never completed.
                _require_started(job, learners)
            else:
                _require(job, RUNNING - {JobStatus.DEPLOYING}, "complete")
            if any(exit_codes):
                # A learner that exited non-zero failed; its agent reports that with Fail instead.
                raise Refused(
                    f"job {job.job_id} is {job.state}; it cannot complete with non-zero exit "
                    f"codes {exit_codes}"
                )
            everyone = range(job.manifest.learners)
            exited = set(everyone if learners is None else learners)
            if exited | set(job.exited) >= set(everyone):
                codes = exit_codes if learners is None else [0] * len(everyone)
                return [JobCompleted(attempt=job.attempt, exit_codes=codes, at=at)]
            new = sorted(exited - set(job.exited))
            if not new:
                raise Refused(f"job {job.job_id}: learners {sorted(exited)} exited already")
            return [LearnersExited(attempt=job.attempt, learners=new, at=at)]
        case RollBack(reason, at, _):
            _require(job, {JobStatus.DEPLOYING}, "roll back")
            if job.rollbacks >= job.manifest.deploy_retries:
                return [
                    JobFailed(
                        attempt=job.attempt,
                        reason=f"deployment failed {job.rollbacks + 1} time(s); last: {reason} "
                        "(deploy_retries sets how often a deployment is tried again)",
                        at=at,
                    )
                ]
            return [DeploymentRolledBack(reason=reason, attempt=job.attempt + 1, at=at)]
        case Fail(reason, at, exit_code):
            return [JobFailed(attempt=job.attempt, reason=reason, exit_code=exit_code, at=at)]
        case Cancel(reason, at):
            return [JobCancelled(reason=reason, at=at)]
        case Restart(reason, at, backoff_s, _, preempted):
            _require(job, RUNNING, "restart")
            if not preempted and job.restarts >= job.manifest.max_restarts:
                limit = job.manifest.max_restarts
                return [
                    JobFailed(
                        attempt=job.attempt,
                        reason=f"restart limit ({limit}) reached; last failure: {reason} "
                        "(max_restarts sets the limit)",
                        at=at,
                    )
                ]
            resume = job.last_checkpoint.path if job.last_checkpoint else None
            return [
                JobRestarted(
                    reason=reason,
                    attempt=job.attempt + 1,
                    resume_from=resume,
                    not_before=at + timedelta(seconds=backoff_s) if backoff_s else None,
                    preempted=preempted,
                    at=at,
                )
            ]
        case StartQueries(at):
            _require(job, {JobStatus.QUEUED}, "start its queries")
            if job.manifest.inference is None:
                raise Refused(f"job {job.job_id} is not an inference job; it has no queries")
            return [JobProcessing(attempt=job.attempt, at=at)]
        case RequestCheckpoint(at):
            _require(job, {JobStatus.PROCESSING}, "checkpoint")
            if job.checkpoint_requested_at is not None:
                # One pending at a time: requests cannot grow the job's stream without bound.
                raise Refused(
                    f"job {job.job_id} is {job.state}; a checkpoint requested at "
                    f"{job.checkpoint_requested_at.isoformat()} is still pending; ask again once "
                    "it is saved (or the attempt ends)"
                )
            return [CheckpointRequested(at=at)]
        case SaveCheckpoint(step, path, size_bytes, duration_s, at):
            _require(job, RUNNING, "record a checkpoint of")
            return [
                CheckpointSaved(
                    attempt=job.attempt,
                    step=step,
                    path=path,
                    size_bytes=size_bytes,
                    duration_s=duration_s,
                    at=at,
                )
            ]
    raise Refused(f"job {job.job_id} is {job.state}; unknown command {type(command).__name__}")


def _enter_phase(
    job: Job, phase: JobStatus, at: datetime, learners: tuple[int, ...] | None
) -> list[JobEvent]:
    """The job enters the furthest phase every learner has reached; learners ahead of it are
    recorded, until the learners on other nodes catch up."""
    if phase not in _PHASE_EVENTS:
        phases = ", ".join(_PHASE_EVENTS)
        raise Refused(
            f"job {job.job_id} is {job.state}; {phase} is not a phase a learner enters "
            f"(only {phases})"
        )
    if not job.state.running:
        raise Refused(f"job {job.job_id} is {job.state}; it cannot enter {phase}")
    # Learners that exited already hold the job back no more: they passed every phase.
    where = {
        n: job.learner_phases.get(n, job.state)
        for n in range(job.manifest.learners)
        if n not in job.exited
    }
    ahead = [
        n
        for n in (where if learners is None else learners)
        if _PHASES.index(phase) > _PHASES.index(where[n])
    ]
    if not ahead:
        raise Refused(f"job {job.job_id} is {job.state}; it cannot enter {phase}")
    where.update(dict.fromkeys(ahead, phase))
    reached = min(where.values(), key=_PHASES.index)
    events: list[JobEvent] = []
    if _PHASES.index(reached) > _PHASES.index(job.state):
        events.append(_PHASE_EVENTS[reached](attempt=job.attempt, at=at))
    if reached != phase:
        events.append(LearnersReachedPhase(attempt=job.attempt, phase=phase, learners=ahead, at=at))
    return events


def _require_started(job: Job, learners: Iterable[int]) -> None:
    unstarted = sorted(n for n in learners if n not in job.learner_phases)
    if unstarted:
        raise Refused(
            f"job {job.job_id} is {job.state}; learners {unstarted} never started, so they "
            "cannot complete"
        )


def _require(job: Job, states: Iterable[JobStatus], verb: str) -> None:
    allowed = set(states)
    if job.state not in allowed:
        names = ", ".join(sorted(allowed))
        raise Refused(f"job {job.job_id} is {job.state}; only a job in {names} can {verb}")


def evolve(job: Job | None, event: JobEvent) -> Job:
    """The job after `event`; events come from the store, so they are trusted to be legal."""
    if isinstance(event, JobSubmitted):
        return Job(
            job_id=event.job_id,
            tenant=event.tenant,
            manifest=event.manifest,
            limits=event.limits,
            state=JobStatus.QUEUED,
            attempt=1,
            restarts=0,
            submitted_at=event.at,
            updated_at=event.at,
            transitions=[Transition(state=JobStatus.QUEUED, at=event.at, attempt=1)],
        )
    if job is None:
        raise ValueError(f"{event.type_name} before JobSubmitted")
    match event:
        case JobDeploying(attempt=attempt, nodes=nodes, gpus=gpus, epoch=epoch):
            placed = {"nodes": nodes, "gpus": gpus, "epoch": epoch}
            job = job.model_copy(update={**placed, "learner_nodes": event.learner_nodes})
            return _enter(job, JobStatus.DEPLOYING, event.at)
        case JobDownloading():
            return _advance(job, JobStatus.DOWNLOADING, event.at)
        case JobProcessing():
            return _advance(job, JobStatus.PROCESSING, event.at)
        case JobStoring():
            return _advance(job, JobStatus.STORING, event.at)
        case LearnersReachedPhase(phase=phase, learners=learners):
            ahead = {**job.learner_phases, **dict.fromkeys(learners, JobStatus(phase))}
            return job.model_copy(update={"learner_phases": ahead, "updated_at": event.at})
        case LearnersExited(learners=learners):
            exited = sorted({*job.exited, *learners})
            return job.model_copy(update={"exited": exited, "updated_at": event.at})
        case JobCompleted(exit_codes=codes):
            return _enter(
                job.model_copy(update={"exit_codes": codes}), JobStatus.COMPLETED, event.at
            )
        case JobFailed(reason=reason, exit_code=code):
            failed = job.model_copy(
                update={"failure_reason": reason, "exit_codes": [] if code is None else [code]}
            )
            return _enter(failed, JobStatus.FAILED, event.at, reason)
        case JobCancelled(reason=reason):
            return _enter(job, JobStatus.CANCELLED, event.at, reason)
        case JobRestarted(
            reason=reason, attempt=attempt, not_before=not_before, preempted=preempted
        ):
            spent = 0 if preempted else 1
            restarted = job.model_copy(
                update={"restarts": job.restarts + spent, "not_before": not_before}
            )
            return _requeue(restarted, attempt, event.at, reason)
        case DeploymentRolledBack(reason=reason, attempt=attempt):
            rolled_back = job.model_copy(update={"rollbacks": job.rollbacks + 1})
            return _requeue(rolled_back, attempt, event.at, reason)
        case CheckpointRequested():
            return job.model_copy(
                update={"checkpoint_requested_at": event.at, "updated_at": event.at}
            )
        case CheckpointSaved(attempt=attempt, step=step, path=path, size_bytes=size):
            checkpoint = Checkpoint(
                attempt=attempt, step=step, path=path, size_bytes=size, at=event.at
            )
            return job.model_copy(
                update={
                    "last_checkpoint": checkpoint,
                    "checkpoint_requested_at": None,
                    "updated_at": event.at,
                }
            )
    raise ValueError(f"unknown job event {event.type_name}")


def _advance(job: Job, phase: JobStatus, at: datetime) -> Job:
    """Enter a phase: learners recorded as ahead are ahead no more once the job catches up."""
    ahead = {n: p for n, p in job.learner_phases.items() if _PHASES.index(p) > _PHASES.index(phase)}
    return _enter(job.model_copy(update={"learner_phases": ahead}), phase, at)


def _requeue(job: Job, attempt: int, at: datetime, reason: str) -> Job:
    """Back to the queue as a new attempt, holding nothing."""
    requeued = job.model_copy(
        update={
            "attempt": attempt,
            "nodes": [],
            "gpus": [],
            "learner_nodes": [],
            "checkpoint_requested_at": None,
            "learner_phases": {},
            "exited": [],
        }
    )
    return _enter(requeued, JobStatus.QUEUED, at, reason)


def _enter(job: Job, state: JobStatus, at: datetime, reason: str | None = None) -> Job:
    transition = Transition(state=state, at=at, attempt=job.attempt, reason=reason)
    return job.model_copy(
        update={"state": state, "updated_at": at, "transitions": [*job.transitions, transition]}
    )


def replay(events: Iterable[JobEvent]) -> Job | None:
    job: Job | None = None
    for event in events:
        job = evolve(job, event)
    return job


def _busy(stream_id: str, tries: int) -> Refused:
    return Refused(f"job {job_id_of(stream_id)} kept changing; gave up after {tries} tries")


JOB: Aggregate[Command, Job | None, JobEvent] = Aggregate(
    event_type=JobEvent, initial=None, decide=decide, evolve=evolve, busy=_busy
)
"""A job's stream, for the command path (events/commands.py)."""
