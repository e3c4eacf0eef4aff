"""The shape of a background worker: `run()` loops until `stop()` sets its stop flag, pausing
between rounds with `pause`, which a stop cuts short and a cancellation always goes through;
each round's step for one item (a job, a deployment, a search) runs `isolated`, so that one
tenant's data never stops the worker for the others."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import TypeVar

from controlplane.database import CONNECTION_ERRORS
from controlplane.instruments import WORKER_ITEM_FAILURES

log = logging.getLogger(__name__)

T = TypeVar("T")


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


def item_failed(worker: str, item: str) -> None:
    """Record that `worker`'s step for `item` failed (called from an exception handler: the
    log carries the traceback), which the worker then leaves for its next round."""
    log.exception("%s: its step for %s failed; going on with the others", worker, item)
    WORKER_ITEM_FAILURES.add(1, {"worker": worker})


async def isolated(worker: str, item: str, step: Awaitable[T]) -> T | None:
    """`step`'s result, or None where it failed on its item's data (logged and counted, see
    `item_failed`). A lost database connection goes on to the worker's own retry (every item
    would fail alike), and a cancellation (a BaseException) always goes through; a statement
    the database refused for this item's data is this item's failure."""
    try:
        return await step
    except CONNECTION_ERRORS:
        raise
    except Exception:
        item_failed(worker, item)
        return None
