"""The `webhook_outbox` projection: a delivery row for each JobRestarted, JobFailed and
JobCompleted of a job with a webhook_url, and for each event of a model's versions and aliases
(models.events.NOTIFIED) while the model has a webhook, written in the transaction that advances
the projection's checkpoint, so that each such event gets exactly one row, however the control
plane crashes or however many replicas run. The relay (`relay.py`) sends them.

It owns no table a rebuild could empty: its rows are deliveries, sent or due, not a read model,
and replaying the log into them would announce old events again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from controlplane.database import Executor
from controlplane.events.records import RecordedEvent
from controlplane.events.types import EventRegistry
from controlplane.jobs.events import (
    JobCompleted,
    JobEvent,
    JobFailed,
    JobRestarted,
    JobSubmitted,
)
from controlplane.jobs.lifecycle import JOB
from controlplane.jobs.streams import CATEGORY as JOB_CATEGORY
from controlplane.jobs.streams import job_id_of
from controlplane.models.events import NOTIFIED as MODEL_NOTIFIED
from controlplane.models.events import (
    ModelEvent,
    ModelWebhookRemoved,
    ModelWebhookSet,
)
from controlplane.models.lifecycle import MODEL
from controlplane.models.streams import CATEGORY as MODEL_CATEGORY
from controlplane.models.streams import model_of
from controlplane.queries import Q
from controlplane.webhooks.streams import webhook_stream

NOTIFIED = (JobRestarted, JobFailed, JobCompleted)
SUBMISSIONS = EventRegistry((JobSubmitted,))
"""What the outbox decodes of the log itself: a job's submission (its stream's first event)."""
WEBHOOK_CHANGES = EventRegistry((ModelWebhookSet, ModelWebhookRemoved))
"""... and a model's webhook changes."""
CHANNEL = "trainyard_webhooks"
"""NOTIFYed when a batch wrote deliveries: wakes the relays (a hint; they also poll)."""

DELIVERY_NAMESPACE = uuid.UUID("0d8f7a52-3c4e-4f6b-9a1d-6e2b5c8f9a34")
"""Delivery ids are uuid5(namespace, '<stream>/<version>'): the same event, the same id."""


def delivery_id(recorded: RecordedEvent) -> uuid.UUID:
    return uuid.uuid5(DELIVERY_NAMESPACE, f"{recorded.stream_id}/{recorded.stream_version}")


class WebhookOutbox:
    name = "webhook_outbox"
    tables: Sequence[str] = ()
    categories: frozenset[str] | None = frozenset({JOB_CATEGORY, MODEL_CATEGORY})

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        # Only job and model streams' events come here (`categories`).
        rows = [
            *await _job_deliveries(conn, [e for e in events if isinstance(e.event, NOTIFIED)]),
            *await _model_deliveries(
                conn, [e for e in events if isinstance(e.event, MODEL_NOTIFIED)]
            ),
        ]
        if not rows:
            return
        await conn.execute(Q["insert_webhook_deliveries"], *map(list, zip(*rows, strict=True)))
        # Delivered at commit, once per transaction however many rows: wakes the relays.
        await conn.execute(Q["notify_webhooks"])


async def _job_deliveries(
    conn: Executor, notified: Sequence[RecordedEvent]
) -> list[tuple[Any, ...]]:
    if not notified:
        return []
    # Who to tell comes from each job's submission (its stream's first event, committed
    # before any event of the job that follows it in the log): one query a batch.
    streams = list(dict.fromkeys(e.stream_id for e in notified))
    submissions: dict[str, JobSubmitted] = {}
    for row in await conn.fetch(Q["job_submissions"], streams):
        submitted = SUBMISSIONS.decode(row["type"], row["schema_version"], row["data"])
        if not isinstance(submitted, JobSubmitted):
            raise TypeError(f"{row['stream_id']} begins with {submitted.type_name}")
        submissions[row["stream_id"]] = submitted
    return [
        _delivery(
            recorded,
            JOB.event_of(recorded),
            {
                "job_id": str(submitted.job_id),
                "job_name": submitted.manifest.name,
                "tenant": submitted.tenant,
            },
            submitted.tenant,
            str(submitted.manifest.webhook_url),
            job_id_of(recorded.stream_id),
        )
        for recorded in notified
        if (submitted := submissions[recorded.stream_id]).manifest.webhook_url is not None
    ]


async def _model_deliveries(
    conn: Executor, notified: Sequence[RecordedEvent]
) -> list[tuple[Any, ...]]:
    """A row for each event of a model whose webhook was set when it happened: folded from
    the webhook changes before it in its stream (this batch's too, read back from the log),
    one query a batch."""
    if not notified:
        return []
    streams = list(dict.fromkeys(e.stream_id for e in notified))
    changes: dict[str, list[tuple[int, str | None]]] = {}
    for row in await conn.fetch(Q["model_webhook_changes"], streams):
        change = WEBHOOK_CHANGES.decode(row["type"], row["schema_version"], row["data"])
        url = change.url if isinstance(change, ModelWebhookSet) else None
        changes.setdefault(row["stream_id"], []).append((row["stream_version"], url))
    rows = []
    for recorded in notified:
        # The last change before the event (they come in stream order).
        url = None
        for version, changed_to in changes.get(recorded.stream_id, []):
            if version < recorded.stream_version:
                url = changed_to
        if url is not None:
            tenant, name = model_of(recorded.stream_id)
            subject = {"tenant": tenant, "model": name}
            rows.append(_delivery(recorded, MODEL.event_of(recorded), subject, tenant, url, None))
    return rows


def _delivery(
    recorded: RecordedEvent,
    event: JobEvent | ModelEvent,
    subject: dict[str, str],
    tenant: str,
    url: str,
    job_id: uuid.UUID | None,
) -> tuple[Any, ...]:
    """A delivery's columns, as insert_webhook_deliveries takes them; its body names the
    event, what it is about (`subject`: the job or the model), where it stands in the log,
    and its data."""
    ident = delivery_id(recorded)
    body = {
        "id": str(ident),
        "type": event.type_name,
        **subject,
        "position": recorded.position,
        "version": recorded.stream_version,
        "at": event.at.isoformat(),
        "data": event.model_dump(mode="json"),
    }
    return (
        ident,
        recorded.position,
        webhook_stream(recorded.stream_id),
        job_id,
        tenant,
        event.type_name,
        url,
        json.dumps(body, separators=(",", ":")),
    )
