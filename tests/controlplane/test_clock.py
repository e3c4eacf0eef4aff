"""The clocks (controlplane/clock.py): the system's tells UTC, a manual one moves when told."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from controlplane.clock import SYSTEM_CLOCK, ManualClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_the_system_clock_tells_utc_now() -> None:
    before = datetime.now(UTC)
    now = SYSTEM_CLOCK.now()
    assert now.tzinfo is UTC and before <= now <= datetime.now(UTC)


def test_a_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(T0)
    assert clock.now() == clock.now() == T0
    clock.advance(timedelta(minutes=5))
    assert clock.now() == T0 + timedelta(minutes=5)
    clock.set(datetime(2026, 1, 1, 9, tzinfo=timezone(timedelta(hours=9))))
    assert clock.now() == T0 and clock.now().tzinfo is UTC


def test_a_manual_clock_refuses_naive_instants_and_going_back() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        ManualClock(datetime(2026, 1, 1))
    clock = ManualClock(T0)
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(timedelta(seconds=-1))
    assert clock.now() == T0
