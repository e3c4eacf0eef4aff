"""Naming the stream of the webhook deliveries about one job or one model.

Delivery outcomes go to `webhook-<job_id>` (or `webhook-model-<tenant>.<name>`), not to the
job's or the model's own stream: those are decided on with optimistic concurrency by agents,
the lifecycle manager and users, and a relay appending there would make their appends conflict
and retry (and would put foreign events in the stream that their lifecycle folds). A stream of
its own is read beside it by the history API.
"""

from __future__ import annotations

CATEGORY = "webhook"


def webhook_stream(notified: str) -> str:
    """The deliveries' stream of the stream `notified` (`job-<id>`, `model-<tenant>.<name>`)."""
    # A job's keeps the name it had before models had webhooks: its job id alone.
    return f"{CATEGORY}-{notified.removeprefix('job-')}"
