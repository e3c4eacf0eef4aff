"""Every event type Trainyard writes, feature by feature, and the one registry every store reads
and writes with: the composition root's, the node agent's, the tools'. A module of its own so that
the agent takes the registry without the control plane's composition root."""

from __future__ import annotations

from controlplane.agents import events as node_events
from controlplane.deployments import events as deployment_events
from controlplane.events.types import Event, EventRegistry
from controlplane.jobs import events as job_events
from controlplane.models import events as model_events
from controlplane.pending import events as pending_events
from controlplane.scheduling import events as scheduling_events
from controlplane.searches import events as search_events
from controlplane.tenants import events as tenant_events
from controlplane.webhooks import events as webhook_events

EVENT_TYPES: tuple[type[Event], ...] = (
    *job_events.EVENT_TYPES,
    *node_events.EVENT_TYPES,
    *model_events.EVENT_TYPES,
    *deployment_events.EVENT_TYPES,
    *tenant_events.EVENT_TYPES,
    *webhook_events.EVENT_TYPES,
    *pending_events.EVENT_TYPES,
    *search_events.EVENT_TYPES,
    *scheduling_events.EVENT_TYPES,
)
"""Every event type Trainyard writes, feature by feature."""
EVENT_REGISTRY = EventRegistry(EVENT_TYPES)
"""What every store of Trainyard's reads and writes with: an event of another type is refused
on append and is an error on reading."""
