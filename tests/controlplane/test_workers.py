"""A worker's pause: a stop cuts it short at once, its length runs out otherwise, and a
cancellation always goes through, also one that comes as the stop does."""

from __future__ import annotations

import asyncio
import time

import pytest

from controlplane.workers import pause


async def test_a_stop_wakes_a_pause_at_once() -> None:
    stopping = asyncio.Event()
    started = time.monotonic()
    pausing = asyncio.create_task(pause(stopping, 60))
    await asyncio.sleep(0.01)
    assert not pausing.done()
    stopping.set()
    assert await pausing is True
    assert time.monotonic() - started < 1


async def test_a_pause_runs_out_when_nobody_stops() -> None:
    assert await pause(asyncio.Event(), 0.01) is False


async def test_a_stopped_worker_does_not_pause() -> None:
    stopping = asyncio.Event()
    stopping.set()
    async with asyncio.timeout(1):
        assert await pause(stopping, 60) is True


async def test_a_cancellation_during_a_pause_propagates() -> None:
    pausing = asyncio.create_task(pause(asyncio.Event(), 60))
    await asyncio.sleep(0.01)
    pausing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pausing


async def test_a_cancellation_that_comes_with_the_stop_propagates() -> None:
    # The race that asyncio.wait_for (3.11) loses: the event is set and the waiter cancelled in
    # one turn of the loop, and wait_for returns as if only the event had come.
    stopping = asyncio.Event()
    pausing = asyncio.create_task(pause(stopping, 60))
    await asyncio.sleep(0.01)
    stopping.set()
    pausing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pausing
