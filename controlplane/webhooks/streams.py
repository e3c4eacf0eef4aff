"""Naming the stream of a job's webhook deliveries.

Delivery outcomes go to `webhook-<job_id>`, not to the job's own stream: the job's stream is
decided on with optimistic concurrency by agents, the lifecycle manager and users, and a relay
appending there would make their appends conflict and retry (and would put non-job events in
the stream that `replay` folds). A stream of its own is read beside it by the history API.
"""

from __future__ import annotations

from uuid import UUID

CATEGORY = "webhook"


def webhook_stream(job_id: UUID) -> str:
    return f"{CATEGORY}-{job_id}"
