"""The events of a node's stream (`node-<name>`): what the record keeps of its life."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from controlplane.events.types import Event, event_type


class GpuInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    uuid: str
    model: str
    memory_mb: int
    healthy: bool
    health_reason: str | None = None


class NodeEvent(Event):
    at: datetime


@event_type("NodeRegistered")
class NodeRegistered(NodeEvent):
    agent_id: UUID
    runtime: str
    cpus: float
    memory_mb: int
    gpus: list[GpuInfo]


@event_type("NodeGpuUnhealthy")
class NodeGpuUnhealthy(NodeEvent):
    """A GPU stopped taking new work (XID or ECC error, or lost)."""

    uuid: str
    reason: str


@event_type("NodeLost")
class NodeLost(NodeEvent):
    """The node stopped renewing its lease: its jobs were restarted elsewhere, and its agent,
    should it come back, must kill its learners (their epoch is stale)."""

    agent_id: UUID
    reason: str


@event_type("NodeDeregistered")
class NodeDeregistered(NodeEvent):
    agent_id: UUID


@event_type("NodeDrained")
class NodeDrained(NodeEvent):
    """An operator took the node out of service: claims place nothing on it, and its agent
    preempts what it runs (its learners asked to checkpoint; their jobs spend no restart)."""

    actor: str
    reason: str | None = None
    """What the operator said of it (None: nothing)."""


@event_type("NodeUndrained")
class NodeUndrained(NodeEvent):
    """An operator put the drained node back in service: claims place work on it again."""

    actor: str


EVENT_TYPES: tuple[type[Event], ...] = (
    NodeRegistered,
    NodeGpuUnhealthy,
    NodeLost,
    NodeDeregistered,
    NodeDrained,
    NodeUndrained,
)
"""This feature's event types, for the registry (see `controlplane.composition`)."""
