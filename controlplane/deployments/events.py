"""The events of deployments' and pipelines' streams (streams.py). Each carries the instant it
happened (`at`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import Field

from controlplane.events.types import Event, event_type
from controlplane.jobs.manifest import within_bounds


class DeploymentEvent(Event):
    at: datetime


def _within_bounds(data: dict[str, Any]) -> dict[str, Any]:
    # Version 1 accepted any `cpus` and task timeout above 0, and any wait from 0: raised to
    # today's floors (what its replicas' manifests now require), so that it still serves.
    resources, serving = data.get("resources"), data.get("serving")
    if not isinstance(resources, dict) or not isinstance(serving, dict):
        return data
    # Read as its replicas' manifests have them: the same floors, in one place.
    bounded = within_bounds({**resources, "servable": serving})
    serving = bounded.pop("servable")
    return {**data, "resources": bounded, "serving": serving}


def _fixed_replicas(data: dict[str, Any]) -> dict[str, Any]:
    # Version 2 had no autoscaling: each deployment served its fixed `replicas`.
    return {**data, "autoscaling": None}


@event_type("DeploymentCreated", version=3, upcasters={1: _within_bounds, 2: _fixed_replicas})
class DeploymentCreated(DeploymentEvent):
    """A model version deployed; the version is resolved once, here, and stays. Version 2: its
    resources and serving within today's floors (`jobs.manifest.MIN_CPUS`, ...); version 3:
    `autoscaling`."""

    tenant: str
    name: str
    model_tenant: str
    model_name: str
    reference: str = Field(description="the model reference as the user wrote it")
    version: int
    artifact_sha256: str
    entry_point: str
    requirements: list[str] = Field(default_factory=list, description="the model's packages")
    resources: dict[str, Any]
    serving: dict[str, Any]
    replicas: int
    actor: str
    inference_job: UUID | None = Field(
        default=None,
        description="the inference job whose queries its replicas run (it owns the deployment)",
    )
    autoscaling: dict[str, Any] | None = Field(
        default=None,
        description="its replicas follow the load within these bounds (spec.Autoscaling); "
        "None: always `replicas`",
    )


@event_type("DeploymentScaled")
class DeploymentScaled(DeploymentEvent):
    """Its owner asked for another fixed number of replicas."""

    replicas: int


@event_type("DeploymentAutoscaled")
class DeploymentAutoscaled(DeploymentEvent):
    """The autoscaler moved its replicas (controlplane/deployments/autoscaler.py), with the load
    that moved it, as the controller's sweep read it."""

    replicas: int
    previous: int = Field(description="the replicas it had")
    in_flight: float = Field(
        description="requests in flight the decision read (queued, "
        "running, and the recent mean of those answered)"
    )
    waiting: int = Field(description="of those, queued for a replica")
    idle_s: float = Field(description="seconds since a request last came or was in flight")


@event_type("DeploymentAutoscalingSet")
class DeploymentAutoscalingSet(DeploymentEvent):
    """Its owner turned autoscaling on or changed its bounds (`autoscaling`), or turned it off
    (None: its replicas stay what they are, a fixed number)."""

    autoscaling: dict[str, Any] | None
    actor: str


def _stable(data: dict[str, Any]) -> dict[str, Any]:
    # Version 1 came before canaries: every replica served the deployment's own version.
    return {**data, "canary": False}


@event_type("ReplicaStarted", version=2, upcasters={1: _stable})
class ReplicaStarted(DeploymentEvent):
    """A replica job was asked for (its job is submitted right after, idempotently). Version 2:
    `canary`."""

    job_id: UUID
    number: int = Field(description="1 for the deployment's first replica, then one more each")
    canary: bool = Field(
        default=False, description="it serves the canary's version, not the deployment's"
    )


@event_type("ReplicaRetired")
class ReplicaRetired(DeploymentEvent):
    """A replica no longer serves: its job ended, or it was stopped (scaled down, deleted,
    unresponsive)."""

    job_id: UUID
    reason: str


@event_type("DeploymentDeleted")
class DeploymentDeleted(DeploymentEvent):
    actor: str


@event_type("CanaryStarted")
class CanaryStarted(DeploymentEvent):
    """Another version of its model now serves `weight`% of its requests beside its own, on
    replicas of its own (canary.py)."""

    reference: str = Field(description="the model reference as the user wrote it")
    version: int
    artifact_sha256: str
    entry_point: str
    requirements: list[str] = Field(default_factory=list)
    weight: int = Field(description="percent of requests it gets, 0 to 100")
    replicas: int
    rollback: dict[str, Any] | None = Field(
        description="when it rolls back by itself (spec.CanaryRollback); None: only by command"
    )
    actor: str


@event_type("CanaryWeightSet")
class CanaryWeightSet(DeploymentEvent):
    """The canary's share of requests moved by command."""

    weight: int
    previous: int
    actor: str


@event_type("CanaryPromoted")
class CanaryPromoted(DeploymentEvent):
    """The canary's version became the deployment's, its replicas the deployment's (the old
    version's replicas are retired in the same append)."""

    reference: str
    version: int
    artifact_sha256: str
    entry_point: str
    previous_version: int
    actor: str


@event_type("CanaryRolledBack")
class CanaryRolledBack(DeploymentEvent):
    """The canary stopped (its replicas retired in the same append): every request goes to the
    deployment's version again. By command, or by the controller when its errors passed its
    rule, with the figures that drove it."""

    version: int
    reason: str
    actor: str
    failed: int | None = Field(default=None, description="its failed requests in the window")
    finished: int | None = Field(default=None, description="its finished requests in the window")
    window_s: float | None = None


class PipelineEvent(Event):
    at: datetime


@event_type("PipelineDefined")
class PipelineDefined(PipelineEvent):
    tenant: str
    name: str
    steps: list[str]
    actor: str


@event_type("PipelineRemoved")
class PipelineRemoved(PipelineEvent):
    actor: str


EVENT_TYPES: tuple[type[Event], ...] = (
    DeploymentCreated,
    DeploymentScaled,
    DeploymentAutoscaled,
    DeploymentAutoscalingSet,
    ReplicaStarted,
    ReplicaRetired,
    CanaryStarted,
    CanaryWeightSet,
    CanaryPromoted,
    CanaryRolledBack,
    DeploymentDeleted,
    PipelineDefined,
    PipelineRemoved,
)
