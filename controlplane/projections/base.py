"""What a projection is: a named read model that applies events inside the runner's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from controlplane.database import Executor
from controlplane.events.records import RecordedEvent


class Projection(Protocol):
    """A read model built from the global log.

    `apply` runs inside the transaction that also advances the projection's checkpoint, so it
    must do all its writes on `conn` and nothing else (no I/O beyond the database).
    """

    name: str
    tables: Sequence[str]
    """The tables it owns: emptied before a rebuild replays the log from zero."""
    categories: frozenset[str] | None
    """The stream categories whose events it applies (None: every event); it is given only
    those, and its checkpoint moves past the others."""

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        """Apply a batch of events, in log order (a batch lets a projection write each of its
        rows once, however many of the batch's events touch it)."""
        ...
