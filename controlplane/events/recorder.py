"""The event store's interface, apart from any storage: what every store offers and every
store's contract tests (tests/controlplane/events/test_event_store_contract.py) hold it to.

Appends inside a caller's transaction (`conn=`) and several streams in one statement
(`append_many`) are the Postgres store's own: they need a database transaction to mean anything.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from controlplane.events.metadata import Metadata
from controlplane.events.records import Appended, LogBatch, LogPosition, RecordedEvent
from controlplane.events.types import Event


class EventRecorder(Protocol):
    """Streams with optimistic concurrency, and one global log that every reader sees in the
    same order."""

    async def append(
        self, stream_id: str, expected_version: int, events: Sequence[Event], metadata: Metadata
    ) -> Appended:
        """Append `events` to a stream at `expected_version` (0: the stream must be new).

        Raises ConcurrencyError, writing nothing, when the stream is at another version;
        ValueError, UnknownEventType or MalformedEvent, writing nothing, for bad input.
        """
        ...

    async def read_stream(
        self, stream_id: str, *, from_version: int = 1, limit: int | None = None
    ) -> list[RecordedEvent]:
        """A stream's events in version order, from `from_version`, at most `limit` of them
        (None: all; empty for a stream that does not exist)."""
        ...

    async def version(self, stream_id: str) -> int:
        """The stream's current version (0 for a stream that does not exist)."""
        ...

    async def read_log(self, after: LogPosition, limit: int = 1000) -> list[RecordedEvent]:
        """Up to `limit` events after `after`, in the one global order every reader sees."""
        ...

    async def read_log_of(
        self, categories: Collection[str] | None, after: LogPosition, limit: int = 1000
    ) -> LogBatch:
        """Like `read_log`, but only the events of streams in `categories` (None: all) are
        returned; the batch also says how many it read, where reading stopped and whether
        committed events after it wait for an older transaction (`LogBatch.held_back`)."""
        ...

    async def log_tail(self) -> LogPosition:
        """The place of the last event readable now (ORIGIN when there is none)."""
        ...

    async def close(self) -> None:
        """Finish the appends in flight."""
        ...
