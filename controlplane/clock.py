"""The time, passed in: services, the lifecycle manager and the agent ask the clock they were
given, so that tests and a simulator can run them on a clock of their own (virtual time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The instant now, UTC-aware."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


SYSTEM_CLOCK = SystemClock()
"""What production runs on, and every constructor's default."""


class ManualClock:
    """A clock that moves only when told to: for tests and simulations."""

    def __init__(self, start: datetime) -> None:
        self._now = _aware(start)

    def now(self) -> datetime:
        return self._now

    def set(self, instant: datetime) -> None:
        self._now = _aware(instant)

    def advance(self, by: timedelta) -> None:
        if by < timedelta(0):
            raise ValueError(f"a clock does not go back (asked to advance by {by})")
        self._now += by


def _aware(instant: datetime) -> datetime:
    if instant.tzinfo is None:
        raise ValueError(f"{instant} has no time zone; a clock tells UTC-aware instants")
    return instant.astimezone(UTC)
