"""Errors of the event store; each message names the stream and version it is about."""

from __future__ import annotations


class EventStoreError(Exception):
    """Base of the event store's errors."""


class ConcurrencyError(EventStoreError):
    """An append's expected version was stale: nothing was written; re-read and retry."""

    def __init__(self, stream_id: str, expected: int, actual: int, detail: str = "") -> None:
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
        reason = detail or f"it is at version {actual}"
        super().__init__(
            f"stream {stream_id}: append expected version {expected}, but {reason}; "
            "nothing was written"
        )


class UnknownEventType(EventStoreError):
    """An event whose type name is not registered."""


class MalformedEvent(EventStoreError):
    """Event data that does not fit its type's schema."""
