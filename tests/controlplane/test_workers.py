"""A worker's pause: a stop cuts it short at once, its length runs out otherwise, and a
cancellation always goes through, also one that comes as the stop does. A worker's step for one
item: its failure is recorded and the worker goes on, but a lost database connection and a
cancellation go through."""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
import pytest

from controlplane.workers import isolated, pause


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


async def test_a_step_that_fails_on_its_item_is_recorded_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done = []

    async def step(n: int) -> int:
        if n == 2:
            raise OverflowError("cannot convert float infinity to integer")
        done.append(n)
        return n

    results = [await isolated("worker", f"item {n}", step(n)) for n in range(4)]
    assert results == [0, 1, None, 3]
    assert done == [0, 1, 3]
    failed = [r for r in caplog.records if r.name == "controlplane.workers"]
    assert [(r.levelno, r.getMessage()) for r in failed] == [
        (logging.ERROR, "worker: its step for item 2 failed; going on with the others")
    ]
    assert failed[0].exc_info is not None  # the traceback, for the operator


async def test_a_statement_refused_for_one_item_is_that_items_failure(pool: asyncpg.Pool) -> None:
    """Postgres refusing one item's values (here an overflow) is no reason to stop the others,
    unlike a lost connection."""
    refused = pool.fetchval("SELECT $1::float8 * 10", 1e308)
    assert await isolated("worker", "item", refused) is None


@pytest.mark.parametrize("error", [ConnectionResetError(), asyncio.CancelledError()])
async def test_a_lost_connection_and_a_cancellation_go_through(error: BaseException) -> None:
    async def step() -> None:
        raise error

    with pytest.raises(type(error)):
        await isolated("worker", "item", step())
