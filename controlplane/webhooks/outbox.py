"""The `webhook_outbox` projection: a delivery row for each JobRestarted, JobFailed and
JobCompleted of a job with a webhook_url, written in the transaction that advances the
projection's checkpoint, so that each such event gets exactly one row, however the control
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
    JobFailed,
    JobRestarted,
    JobSubmitted,
)
from controlplane.jobs.lifecycle import JOB
from controlplane.jobs.streams import CATEGORY, job_id_of
from controlplane.queries import Q

NOTIFIED = (JobRestarted, JobFailed, JobCompleted)
SUBMISSIONS = EventRegistry((JobSubmitted,))
"""What the outbox decodes of the log itself: a job's submission (its stream's first event)."""
CHANNEL = "trainyard_webhooks"
"""NOTIFYed when a batch wrote deliveries: wakes the relays (a hint; they also poll)."""

DELIVERY_NAMESPACE = uuid.UUID("0d8f7a52-3c4e-4f6b-9a1d-6e2b5c8f9a34")
"""Delivery ids are uuid5(namespace, '<stream>/<version>'): the same event, the same id."""


def delivery_id(recorded: RecordedEvent) -> uuid.UUID:
    return uuid.uuid5(DELIVERY_NAMESPACE, f"{recorded.stream_id}/{recorded.stream_version}")


class WebhookOutbox:
    name = "webhook_outbox"
    tables: Sequence[str] = ()
    categories: frozenset[str] | None = frozenset({CATEGORY})

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        # Only job streams' events come here (`categories`).
        notified = [e for e in events if isinstance(e.event, NOTIFIED)]
        if not notified:
            return
        # Who to tell comes from each job's submission (its stream's first event, committed
        # before any event of the job that follows it in the log): one query a batch.
        streams = list(dict.fromkeys(e.stream_id for e in notified))
        submissions: dict[str, JobSubmitted] = {}
        for row in await conn.fetch(Q["job_submissions"], streams):
            submitted = SUBMISSIONS.decode(row["type"], row["schema_version"], row["data"])
            if not isinstance(submitted, JobSubmitted):
                raise TypeError(f"{row['stream_id']} begins with {submitted.type_name}")
            submissions[row["stream_id"]] = submitted
        rows = [
            _delivery(recorded, submitted)
            for recorded in notified
            if (submitted := submissions[recorded.stream_id]).manifest.webhook_url is not None
        ]
        if not rows:
            return
        await conn.execute(Q["insert_webhook_deliveries"], *map(list, zip(*rows, strict=True)))
        # Delivered at commit, once per transaction however many rows: wakes the relays.
        await conn.execute(Q["notify_webhooks"])


def _delivery(recorded: RecordedEvent, submitted: JobSubmitted) -> tuple[Any, ...]:
    event = JOB.event_of(recorded)
    ident = delivery_id(recorded)
    body = {
        "id": str(ident),
        "type": event.type_name,
        "job_id": str(submitted.job_id),
        "job_name": submitted.manifest.name,
        "tenant": submitted.tenant,
        "position": recorded.position,
        "version": recorded.stream_version,
        "at": event.at.isoformat(),
        "data": event.model_dump(mode="json"),
    }
    return (
        ident,
        recorded.position,
        job_id_of(recorded.stream_id),
        submitted.tenant,
        event.type_name,
        str(submitted.manifest.webhook_url),
        json.dumps(body, separators=(",", ":")),
    )
