"""The shape of a background worker: `run()` loops until `stop()` sets its stop flag, pausing
between rounds with `pause`, which a stop cuts short and a cancellation always goes through."""

from __future__ import annotations

import asyncio
import contextlib


async def pause(stopping: asyncio.Event, seconds: float) -> bool:
    """Wait `seconds`, or less once `stopping` is set; whether it is set (the worker stops).

    asyncio.timeout, not wait_for: wait_for (3.11) can swallow a cancellation that arrives as
    the event is set, and a cancelled worker would then go on.
    """
    if not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await stopping.wait()
    return stopping.is_set()
