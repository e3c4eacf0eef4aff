"""What an attempt's result means for its delivery, as a pure function: delivered, tried again
after an exponential backoff, or given up after the last allowed attempt."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from controlplane.webhooks.events import (
    AttemptOutcome,
    WebhookAttemptFailed,
    WebhookDelivered,
    WebhookFailed,
)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 12
    first_backoff_s: float = 5.0
    max_backoff_s: float = 3600.0
    jitter: float = 0.2
    """Each backoff is stretched by up to this fraction, so that the retries of many deliveries
    that failed together (a receiver's outage) do not all come back at the same instant."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("a delivery needs at least one attempt")

    def backoff_s(self, attempt: int, spread: float) -> float:
        """The wait after failed attempt `attempt` (from 1): the first backoff doubled per
        attempt, capped, then stretched by `spread` (in [0, 1)) times the jitter."""
        base = min(self.max_backoff_s, self.first_backoff_s * 2.0 ** (attempt - 1))
        return base * (1 + self.jitter * spread)


@dataclass(frozen=True, slots=True)
class Attempt:
    """An attempt as claimed: which delivery, which try, and when it began."""

    delivery_id: UUID
    job_event: str
    job_event_position: int
    number: int
    started_at: datetime


@dataclass(frozen=True, slots=True)
class Result:
    """What came back: a status (None when no answer came) and, for a failure, why."""

    status: int | None
    error: str | None
    at: datetime
    final: bool = False
    """Trying again cannot help (the receiver's address is refused): give up now."""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def outcome(policy: RetryPolicy, attempt: Attempt, result: Result, spread: float) -> AttemptOutcome:
    """The event that records the attempt: delivered, failed and retried, or given up."""
    common = _fields(attempt, result.at, result.status)
    if result.ok:
        return WebhookDelivered(**common)
    error = result.error or f"HTTP {result.status}"
    if result.final or attempt.number >= policy.max_attempts:
        return WebhookFailed(**common, error=error)
    wait = timedelta(seconds=policy.backoff_s(attempt.number, spread))
    return WebhookAttemptFailed(**common, error=error, retry_at=result.at + wait)


def interrupted(attempt: Attempt, at: datetime) -> WebhookAttemptFailed:
    """An attempt cut off by its relay stopping: due again at once, with no backoff (the
    receiver did nothing wrong). It counts, since its request may have reached the receiver:
    the next attempt has the next number, so no two requests of a delivery carry the same."""
    return WebhookAttemptFailed(
        **_fields(attempt, at, None), error="interrupted: the relay stopped", retry_at=at
    )


def _fields(attempt: Attempt, at: datetime, status: int | None) -> dict[str, Any]:
    return {
        "delivery_id": attempt.delivery_id,
        "job_event": attempt.job_event,
        "job_event_position": attempt.job_event_position,
        "attempt": attempt.number,
        "started_at": attempt.started_at,
        "at": at,
        "status": status,
    }
