"""The events of webhook notifications: a tenant's secret rotated (on `tenant-<name>`), and each
delivery attempt's outcome (on `webhook-<job_id>` or `webhook-model-<tenant>.<name>`, beside the
job's or the model's own stream, see `streams`)."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import Field

from controlplane.events.types import Event, event_type
from controlplane.tenants.events import TenantEvent


@event_type("WebhookSecretRotated")
class WebhookSecretRotated(TenantEvent):
    """The tenant's webhook signing secret was replaced; the secret itself is never an event."""

    secret_id: str
    previous_valid_until: datetime | None = Field(
        description="until when deliveries are also signed with the secret it replaced"
    )


class WebhookAttempt(Event):
    """One attempt to POST a notification of one event of a job (to its webhook_url) or of a
    model (to the URL its tenant set). The `job_` fields are named as when only jobs had
    webhooks: recorded events keep their fields for good."""

    delivery_id: UUID = Field(description="the delivery; receivers dedupe on it")
    job_event: str = Field(
        description="the event notified: JobRestarted, JobFailed, ..., ModelVersionPublished, ..."
    )
    job_event_position: int = Field(description="its position in the global log")
    attempt: int = Field(description="the attempt's number, from 1")
    started_at: datetime
    at: datetime = Field(description="when the attempt ended")
    status: int | None = Field(description="the receiver's HTTP status; None when none came")


@event_type("WebhookDelivered")
class WebhookDelivered(WebhookAttempt):
    """The receiver answered 2xx."""


@event_type("WebhookAttemptFailed")
class WebhookAttemptFailed(WebhookAttempt):
    """The attempt failed and the delivery is tried again, not before `retry_at` (backoff)."""

    error: str
    retry_at: datetime


@event_type("WebhookFailed")
class WebhookFailed(WebhookAttempt):
    """The last allowed attempt failed: the delivery is given up."""

    error: str


AttemptOutcome = WebhookDelivered | WebhookAttemptFailed | WebhookFailed


EVENT_TYPES: tuple[type[Event], ...] = (
    WebhookSecretRotated,
    WebhookDelivered,
    WebhookAttemptFailed,
    WebhookFailed,
)
"""This feature's event types, for the registry (see `controlplane.composition`)."""
