"""What became of a job's or a model's notifications: every delivery attempt, as its history
shows them, read from the stream the relay records them in (see `webhooks.streams`)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from controlplane.events.store import EventStore
from controlplane.invariants import InvariantBroken
from controlplane.webhooks.events import WebhookAttempt
from controlplane.webhooks.streams import webhook_stream


class Delivery(BaseModel):
    """One delivery attempt; `error` and `retry_at` only where the attempt failed."""

    model_config = ConfigDict(frozen=True)

    version: int
    position: int
    event: Literal["WebhookDelivered", "WebhookAttemptFailed", "WebhookFailed"] = Field(
        description="delivered (2xx); failed and retried at retry_at; failed on the last "
        "attempt (given up)"
    )
    delivery_id: UUID
    job_event: str
    job_event_position: int
    attempt: int
    started_at: datetime
    at: datetime
    status: int | None
    error: str | None = Field(default=None, exclude_if=lambda value: value is None)
    retry_at: datetime | None = Field(default=None, exclude_if=lambda value: value is None)


async def delivery_history(store: EventStore, notified: str) -> list[Delivery]:
    """Every delivery attempt of the notifications of the stream `notified` (a job's, a
    model's), in the order they ended."""
    entries = []
    for recorded in await store.read_stream(webhook_stream(notified)):
        if not isinstance(recorded.event, WebhookAttempt):
            raise InvariantBroken(
                f"{recorded.stream_id} holds {recorded.event.type_name}, not a delivery attempt"
            )
        entries.append(
            Delivery.model_validate(
                {
                    "version": recorded.stream_version,
                    "position": recorded.position,
                    "event": recorded.event.type_name,
                    **recorded.event.model_dump(),
                }
            )
        )
    return entries
