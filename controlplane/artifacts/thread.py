"""A thread of its own for one open file, so that the event loop never waits on a disk (or on
a network file system mounted for a fleet).

One thread per file, not the loop's shared pool: its calls run one after another in the order
given, so the last one (closing the file, removing a temporary one) runs after every read or
write before it, also after one still running in the thread when its caller was cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class FileThread:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="artifact-file")

    async def run(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`call(*args, **kwargs)` in the thread, after every call given before it.

        Cancelling the caller does not stop a call that has started: it finishes in the thread.
        """
        return await asyncio.wrap_future(self._executor.submit(call, *args, **kwargs))

    async def finish(self, call: Callable[[], None]) -> None:
        """The thread's last call (closing or discarding the file): it runs after every call
        given before it even if the caller is cancelled meanwhile; then the thread ends."""
        last = asyncio.wrap_future(self._executor.submit(call))
        self._executor.shutdown(wait=False)
        # Shielded: a cancellation while the call still waits its turn must not drop it.
        await asyncio.shield(last)
