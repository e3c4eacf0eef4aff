"""What the event store takes and returns: pure records, shared by every store behind the
`EventRecorder` interface (Postgres in production, memory in tests and simulations)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from controlplane.events.metadata import Metadata
from controlplane.events.types import Event


class LogPosition(NamedTuple):
    """A reader's place in the global log: the (xid, position) of the last event it read."""

    xid: int
    position: int


ORIGIN = LogPosition(0, 0)
"""Before the first event."""


def category_of(stream_id: str) -> str:
    """A stream's category: its id up to the first `-` (`job-<uuid>` is a `job` stream), as
    `read_log` reads it in SQL (`split_part`)."""
    return stream_id.partition("-")[0]


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An event as stored: where it sits in its stream and in the global log, and when."""

    position: int
    xid: int
    stream_id: str
    stream_version: int
    event: Event
    metadata: Metadata
    recorded_at: datetime

    @property
    def log_position(self) -> LogPosition:
        return LogPosition(self.xid, self.position)

    @property
    def category(self) -> str:
        return category_of(self.stream_id)


@dataclass(frozen=True, slots=True)
class Appended:
    """The outcome of an append: the stream's new version and the events' global positions."""

    stream_id: str
    version: int
    positions: tuple[int, ...]
    xid: int
    recorded_at: datetime

    @property
    def log_position(self) -> LogPosition:
        """The place of the last appended event in the global log."""
        return LogPosition(self.xid, self.positions[-1])


@dataclass(frozen=True, slots=True)
class LogBatch:
    """What one read of the log returned: the wanted events, how many it read in all, and the
    place of the last one read (`after` when it read none)."""

    events: list[RecordedEvent]
    read: int
    end: LogPosition
    held_back: bool = False
    """Whether committed events after `end` wait for an older transaction still running: news
    that the transaction's end may announce to no one (it may append nothing), so that a
    reader looks again soon (`HeldBack`) rather than at its next notification."""


@dataclass(frozen=True, slots=True)
class StreamAppend:
    """Events for one stream, to be appended only if it is at `expected_version`."""

    stream_id: str
    expected_version: int
    events: Sequence[Event]
    metadata: Metadata
