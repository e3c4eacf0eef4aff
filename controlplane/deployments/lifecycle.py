"""Deployments' and pipelines' lifecycles as pure functions: `decide` turns a command and the
state into new events (or a refusal, raised), `evolve` folds events into the state; DEPLOYMENT
and PIPELINE are the aggregates for the command path (events/commands.py). No I/O here."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from controlplane.deployments.errors import Conflict, InvalidRequest, NotFound, ServingError
from controlplane.deployments.events import (
    CanaryPromoted,
    CanaryRolledBack,
    CanaryStarted,
    CanaryWeightSet,
    DeploymentAutoscaled,
    DeploymentAutoscalingSet,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentEvent,
    DeploymentScaled,
    PipelineDefined,
    PipelineEvent,
    PipelineRemoved,
    ReplicaRetired,
    ReplicaStarted,
)
from controlplane.events.commands import Aggregate
from controlplane.invariants import InvariantBroken
from controlplane.jobs.lifecycle import JobStatus


class Busy(ServingError):
    """The stream kept changing under concurrent commands; the command gave up."""


@dataclass(frozen=True, slots=True)
class Canary:
    """Another version of the deployment's model, beside it on replicas of its own."""

    reference: str
    version: int
    artifact_sha256: str
    entry_point: str
    requirements: tuple[str, ...]
    weight: int
    """Percent of requests it gets (canary.to_canary)."""
    replicas: int
    rollback: dict[str, Any] | None
    """When it rolls back by itself (canary.Rollback); None: only by command."""
    started_at: datetime
    active: tuple[UUID, ...] = ()
    """Its replica jobs, oldest first."""
    failures: int = 0
    """Its replicas retired in a row because their job FAILED: at CANARY_FAILURES it is rolled
    back (a version that cannot run never takes requests it cannot answer)."""


CANARY_FAILURES = 3
"""A canary's replicas that may fail in a row (each after its own restarts) before the canary
is rolled back, in the same append as the last one's retirement."""


@dataclass(frozen=True, slots=True)
class Deployment:
    tenant: str
    name: str
    model_tenant: str
    model_name: str
    reference: str
    version: int
    artifact_sha256: str
    entry_point: str
    requirements: tuple[str, ...]
    resources: dict[str, Any]
    serving: dict[str, Any]
    replicas: int
    created_at: datetime
    updated_at: datetime
    active: tuple[UUID, ...] = ()
    """The replica jobs serving it now, oldest first."""
    started: int = 0
    """Replicas ever started in this stream (across re-creations): numbers their jobs."""
    deleted: bool = False
    failures: int = 0
    """Replicas retired in a row because their job FAILED (what a model that cannot run
    causes): past a few, new ones are started ever more slowly (reconcile.py)."""
    last_failure_at: datetime | None = None
    inference_job: UUID | None = None
    """The inference job that owns it: its replicas run that job's queries, and only the job
    scales or deletes it."""
    autoscaling: dict[str, Any] | None = None
    """Its replicas follow the load within these bounds (spec.Autoscaling); None: `replicas`
    stays what its owner asks for."""
    canary: Canary | None = None

    @property
    def live(self) -> bool:
        return not self.deleted


# Commands, each with the instant it is decided at.


@dataclass(frozen=True, slots=True)
class Create:
    event: DeploymentCreated


@dataclass(frozen=True, slots=True)
class Scale:
    replicas: int
    at: datetime


@dataclass(frozen=True, slots=True)
class Autoscale:
    """The autoscaler's decision (autoscaler.py), with the load it read."""

    replicas: int
    in_flight: float
    waiting: int
    idle_s: float
    at: datetime


@dataclass(frozen=True, slots=True)
class SetAutoscaling:
    """Its owner's: autoscaling on, within new bounds, or off (None)."""

    autoscaling: dict[str, Any] | None
    actor: str
    at: datetime


@dataclass(frozen=True, slots=True)
class ChangeReplicas:
    at: datetime
    retire: tuple[tuple[UUID, str], ...] = ()
    """Replica jobs that no longer serve (the deployment's or its canary's), and why."""
    start: tuple[UUID, ...] = ()
    """New replica jobs, numbered on from the last."""
    start_canary: tuple[UUID, ...] = ()
    """New replica jobs of its canary, numbered on after `start`."""


@dataclass(frozen=True, slots=True)
class Delete:
    actor: str
    at: datetime


@dataclass(frozen=True, slots=True)
class StartCanary:
    """Its owner's: a canary of another version, or (one running already) its new weight."""

    event: CanaryStarted


@dataclass(frozen=True, slots=True)
class PromoteCanary:
    actor: str
    at: datetime


@dataclass(frozen=True, slots=True)
class RollBackCanary:
    """By its owner's command (no figures), or the controller's rule (canary.rollback_reason)
    with the figures that drove it; `version`: the canary the decision was about, so a rollback
    decided on an older canary's errors refuses rather than stop a newer one."""

    version: int
    reason: str
    actor: str
    at: datetime
    failed: int | None = None
    finished: int | None = None
    window_s: float | None = None


DeploymentCommand = (
    Create
    | Scale
    | Autoscale
    | SetAutoscaling
    | ChangeReplicas
    | Delete
    | StartCanary
    | PromoteCanary
    | RollBackCanary
)


def decide(command: DeploymentCommand, state: Deployment | None) -> list[DeploymentEvent]:
    if isinstance(command, Create):
        if state is not None and state.live:
            raise Conflict(f"deployment {command.event.name} exists; scale or delete it")
        if state is not None and _replicas(state):
            raise Conflict(
                f"deployment {command.event.name} is still stopping its replicas; try again "
                "once they have stopped"
            )
        return [command.event]
    if state is None or (state.deleted and not isinstance(command, ChangeReplicas)):
        raise NotFound("no such deployment")
    match command:
        case Scale(replicas=replicas, at=at):
            if state.autoscaling is not None:
                raise Conflict(
                    f"deployment {state.name} is autoscaled (between "
                    f"{state.autoscaling['min_replicas']} and "
                    f"{state.autoscaling['max_replicas']} replicas): its load sets its replicas; "
                    "turn its autoscaling off first (DELETE /v1/deployments/"
                    f"{state.name}/autoscaling)"
                )
            if replicas == state.replicas:
                return []
            return [DeploymentScaled(replicas=replicas, at=at)]
        case Autoscale(replicas=wanted, at=at):
            if state.autoscaling is None:
                return []  # no longer autoscaled: nothing to do
            # Within the bounds as they are now: a sweep decides before its event is in, and
            # its owner may have narrowed them meanwhile (the retry decides again, here).
            replicas = min(
                max(wanted, state.autoscaling["min_replicas"]), state.autoscaling["max_replicas"]
            )
            if replicas == state.replicas:
                return []  # already there
            return [
                DeploymentAutoscaled(
                    replicas=replicas,
                    previous=state.replicas,
                    in_flight=command.in_flight,
                    waiting=command.waiting,
                    idle_s=command.idle_s,
                    at=at,
                )
            ]
        case SetAutoscaling(autoscaling=autoscaling, actor=actor, at=at):
            if autoscaling == state.autoscaling:
                return []  # as it is already
            return [DeploymentAutoscalingSet(autoscaling=autoscaling, actor=actor, at=at)]
        case ChangeReplicas(at=at, retire=retire, start=start, start_canary=start_canary):
            if state.deleted and (start or start_canary):
                raise NotFound("no such deployment")
            if start_canary and state.canary is None:
                raise Conflict(f"deployment {state.name} has no canary")
            retired: list[DeploymentEvent] = [
                ReplicaRetired(job_id=job_id, reason=reason, at=at)
                for job_id, reason in retire
                if job_id in _replicas(state)
            ]
            numbered = [(job_id, False) for job_id in start] + [
                (job_id, True) for job_id in start_canary
            ]
            failing = _failing_canary(state, retired, at)
            if failing:
                numbered = [(job_id, False) for job_id in start]  # none for a canary rolled back
            started = [
                ReplicaStarted(job_id=job_id, number=state.started + n, canary=canary, at=at)
                for n, (job_id, canary) in enumerate(numbered, start=1)
            ]
            return [*retired, *failing, *started]
        case Delete(actor=actor, at=at):
            return [DeploymentDeleted(actor=actor, at=at)]
        case StartCanary(event=event):
            return _start_canary(state, event)
        case PromoteCanary(actor=actor, at=at):
            canary = _the_canary(state)
            # The old version's replicas are retired in the same append: no moment in the
            # stream where a replica serves a version the deployment no longer has.
            reason = f"replaced by version {canary.version} (canary promoted)"
            return [
                *(ReplicaRetired(job_id=job_id, reason=reason, at=at) for job_id in state.active),
                CanaryPromoted(
                    reference=canary.reference,
                    version=canary.version,
                    artifact_sha256=canary.artifact_sha256,
                    entry_point=canary.entry_point,
                    previous_version=state.version,
                    actor=actor,
                    at=at,
                ),
            ]
        case RollBackCanary(version=version, at=at):
            canary = _the_canary(state)
            if canary.version != version:
                # Decided on another canary (one rolled back meanwhile and a new one started):
                # its figures say nothing about this one.
                raise Conflict(
                    f"deployment {state.name}'s canary is version {canary.version}, not {version}"
                )
            reason = f"canary version {version} rolled back"
            return [
                *(ReplicaRetired(job_id=job_id, reason=reason, at=at) for job_id in canary.active),
                CanaryRolledBack(
                    version=version,
                    reason=command.reason,
                    actor=command.actor,
                    failed=command.failed,
                    finished=command.finished,
                    window_s=command.window_s,
                    at=at,
                ),
            ]
    raise InvariantBroken(f"unknown command {command!r}")


def evolve(state: Deployment | None, event: DeploymentEvent) -> Deployment | None:
    match event:
        case DeploymentCreated():
            return Deployment(
                tenant=event.tenant,
                name=event.name,
                model_tenant=event.model_tenant,
                model_name=event.model_name,
                reference=event.reference,
                version=event.version,
                artifact_sha256=event.artifact_sha256,
                entry_point=event.entry_point,
                requirements=tuple(event.requirements),
                resources=event.resources,
                serving=event.serving,
                replicas=event.replicas,
                created_at=event.at,
                updated_at=event.at,
                started=0 if state is None else state.started,
                inference_job=event.inference_job,
                autoscaling=event.autoscaling,
            )
    if state is None:
        raise InvariantBroken(f"{event.type_name} before DeploymentCreated")
    match event:
        case DeploymentScaled(replicas=replicas):
            return replace(state, replicas=replicas, updated_at=event.at, failures=0)
        case DeploymentAutoscaled(replicas=replicas):
            # Failures stay counted: the load asking for replicas is no owner's new try, and a
            # model that cannot run keeps its backoff (reconcile.next_start).
            return replace(state, replicas=replicas, updated_at=event.at)
        case DeploymentAutoscalingSet(autoscaling=autoscaling):
            # Its replicas stay until the next sweep moves them within the new bounds; the
            # delay before fewer runs from here.
            return replace(state, autoscaling=autoscaling, updated_at=event.at)
        case ReplicaStarted(job_id=job_id, number=number, canary=True):
            canary = _the_canary(state)
            return replace(
                state, canary=replace(canary, active=(*canary.active, job_id)), started=number
            )
        case ReplicaStarted(job_id=job_id, number=number):
            return replace(state, active=(*state.active, job_id), started=number)
        case ReplicaRetired(job_id=job_id, reason=reason) if (
            state.canary and job_id in state.canary.active
        ):
            # A canary's failures are not the deployment's: its backoff stays its own version's.
            canary = state.canary
            active = tuple(j for j in canary.active if j != job_id)
            failed = reason == failed_reason(JobStatus.FAILED)
            failures = canary.failures + 1 if failed else 0
            return replace(state, canary=replace(canary, active=active, failures=failures))
        case ReplicaRetired(job_id=job_id, reason=reason):
            active = tuple(j for j in state.active if j != job_id)
            if reason == failed_reason(JobStatus.FAILED):
                return replace(
                    state, active=active, failures=state.failures + 1, last_failure_at=event.at
                )
            return replace(state, active=active, failures=0)
        case DeploymentDeleted():
            return replace(state, deleted=True, updated_at=event.at)
        case CanaryStarted():
            return replace(
                state,
                canary=Canary(
                    reference=event.reference,
                    version=event.version,
                    artifact_sha256=event.artifact_sha256,
                    entry_point=event.entry_point,
                    requirements=tuple(event.requirements),
                    weight=event.weight,
                    replicas=event.replicas,
                    rollback=event.rollback,
                    started_at=event.at,
                ),
                updated_at=event.at,
            )
        case CanaryWeightSet(weight=weight):
            canary = _the_canary(state)
            return replace(state, canary=replace(canary, weight=weight), updated_at=event.at)
        case CanaryPromoted():
            canary = _the_canary(state)
            # Its owner's number of replicas stays; reconcile tops the canary's up to it.
            return replace(
                state,
                reference=canary.reference,
                version=canary.version,
                artifact_sha256=canary.artifact_sha256,
                entry_point=canary.entry_point,
                requirements=canary.requirements,
                active=canary.active,
                canary=None,
                failures=0,
                last_failure_at=None,
                updated_at=event.at,
            )
        case CanaryRolledBack():
            return replace(state, canary=None, updated_at=event.at)
    raise InvariantBroken(f"unknown event {event!r}")


def _replicas(state: Deployment) -> tuple[UUID, ...]:
    """Every replica job it has: its own and its canary's."""
    return state.active if state.canary is None else (*state.active, *state.canary.active)


def _failing_canary(
    state: Deployment, retired: list[DeploymentEvent], at: datetime
) -> list[DeploymentEvent]:
    """The canary's rollback, when the replicas `retired` take its failures in a row to
    CANARY_FAILURES: its other replicas retired too, and why (none otherwise)."""
    after = DEPLOYMENT.fold(state, retired)
    canary = None if after is None else after.canary
    if canary is None or canary.failures < CANARY_FAILURES:
        return []
    reason = f"canary version {canary.version} rolled back"
    return [
        *(ReplicaRetired(job_id=job_id, reason=reason, at=at) for job_id in canary.active),
        CanaryRolledBack(
            version=canary.version,
            reason=f"its replicas' jobs failed {canary.failures} times in a row",
            actor="system:canary",
            at=at,
        ),
    ]


def _the_canary(state: Deployment) -> Canary:
    if state.canary is None:
        raise Conflict(f"deployment {state.name} has no canary")
    return state.canary


def _start_canary(state: Deployment, event: CanaryStarted) -> list[DeploymentEvent]:
    if state.inference_job is not None:
        raise Conflict(f"deployment {state.name} runs an inference job's queries: no canary")
    canary = state.canary
    if canary is None:
        if event.version == state.version:
            raise InvalidRequest(
                f"version {event.version} is the deployment's own; a canary is another version",
                field="model",
            )
        return [event]
    if event.version != canary.version:
        raise Conflict(
            f"deployment {state.name} has a canary of version {canary.version} already: "
            "promote it or roll it back first"
        )
    if (event.replicas, event.rollback) != (canary.replicas, canary.rollback):
        raise Conflict(
            f"the canary of deployment {state.name} runs with other replicas or rollback rule; "
            "only its weight moves (roll it back and start it again to change the rest)"
        )
    if event.weight == canary.weight:
        return []  # as it is already
    return [
        CanaryWeightSet(weight=event.weight, previous=canary.weight, actor=event.actor, at=event.at)
    ]


def failed_reason(status: JobStatus) -> str:
    """Why a replica whose job ended is retired."""
    return f"its job ended {status.value}"


def _busy(stream_id: str, tries: int) -> Exception:
    return Busy(f"{stream_id} kept changing ({tries} tries); try again")


DEPLOYMENT: Aggregate[DeploymentCommand, Deployment | None, DeploymentEvent] = Aggregate(
    event_type=DeploymentEvent, initial=None, decide=decide, evolve=evolve, busy=_busy
)


@dataclass(frozen=True, slots=True)
class Pipeline:
    tenant: str
    name: str
    steps: tuple[str, ...]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Define:
    event: PipelineDefined


@dataclass(frozen=True, slots=True)
class Remove:
    actor: str
    at: datetime


PipelineCommand = Define | Remove


def decide_pipeline(command: PipelineCommand, state: Pipeline | None) -> list[PipelineEvent]:
    match command:
        case Define(event=event):
            if state is not None:
                if state.steps == tuple(event.steps):
                    return []  # the same definition again: nothing to do
                raise Conflict(f"pipeline {event.name} exists with other steps; remove it first")
            return [event]
        case Remove(actor=actor, at=at):
            if state is None:
                raise NotFound("no such pipeline")
            return [PipelineRemoved(actor=actor, at=at)]
    raise InvariantBroken(f"unknown command {command!r}")


def evolve_pipeline(state: Pipeline | None, event: PipelineEvent) -> Pipeline | None:
    match event:
        case PipelineDefined():
            return Pipeline(event.tenant, event.name, tuple(event.steps), event.at)
        case PipelineRemoved():
            return None
    raise InvariantBroken(f"unknown event {event!r}")


PIPELINE: Aggregate[PipelineCommand, Pipeline | None, PipelineEvent] = Aggregate(
    event_type=PipelineEvent,
    initial=None,
    decide=decide_pipeline,
    evolve=evolve_pipeline,
    busy=_busy,
)
