"""The events of a job's pending stream (`pending-<job_id>`)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from controlplane.events.types import Event, event_type
from controlplane.pending.reasons import Blocking, Reason


class PendingReason(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: Reason
    blocking: Blocking
    detail: str


@event_type("PendingReasonsChanged")
class PendingReasonsChanged(Event):
    """The set of reasons holding a queued job back changed; none once it left the queue (its
    attempt claimed, or the job ended). A change of detail alone (one job fewer ahead) is not
    recorded: the reasons' row has the latest."""

    at: datetime
    attempt: int
    reasons: list[PendingReason]


EVENT_TYPES: tuple[type[Event], ...] = (PendingReasonsChanged,)
"""This feature's event types, for the registry (see `controlplane.event_registry`)."""
