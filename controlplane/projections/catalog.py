"""Every projection the control plane runs, by name."""

from __future__ import annotations

from controlplane.jobs.projection import JobsProjection
from controlplane.projections.base import Projection
from controlplane.projections.streams import StreamsProjection
from controlplane.tenants.projection import TenantsProjection
from controlplane.webhooks.outbox import WebhookOutbox


def all_projections() -> list[Projection]:
    return [StreamsProjection(), JobsProjection(), TenantsProjection(), WebhookOutbox()]
