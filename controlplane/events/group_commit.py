"""Group commit: writes requested while others are in flight go together in the next one.

Under load many callers append at once (the API's submits, an agent's learners reporting); each
alone would pay a round trip and a commit. Here at most `slots` writes are in flight, and
whatever was requested meanwhile waits and goes out as one batch: a lone caller is written at
once, and a crowd shares statements and commits.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

SLOTS = 2
"""Batches in flight at once: one being written while the next gathers."""
MAX_BATCH = 256


class GroupCommit(Generic[T, R]):
    """Hands batches of submitted items to `write`, which returns one result per item, in order.

    Two items with the same `key` never share a batch (two appends to one stream would refuse
    each other); the later waits for the next.
    """

    def __init__(
        self,
        write: Callable[[list[T]], Awaitable[list[R]]],
        key: Callable[[T], Hashable],
        *,
        slots: int = SLOTS,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._write = write
        self._key = key
        self._slots = slots
        self._max_batch = max_batch
        self._queue: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._writing = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> R:
        """Write `item` in the next batch; its result, or the error that writing it alone
        raised. Cancelled before its batch is written, it is not written at all."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._writing < self._slots:
            self._writing += 1
            writer = asyncio.create_task(self._drain(), name="group-commit")
            self._tasks.add(writer)  # the loop keeps only a weak reference
            writer.add_done_callback(self._tasks.discard)
        return await future

    async def close(self) -> None:
        """Wait for the batches in flight and those queued."""
        while self._tasks:
            await asyncio.gather(*self._tasks)

    async def _drain(self) -> None:
        try:
            # One turn of the event loop first: callers started together (an agent's
            # learners reporting at once) all join the first batch instead of the first
            # going alone.
            await asyncio.sleep(0)
            while batch := self._take():
                await self._deliver(batch)
        finally:
            # Counted down in the same step as the empty take (no await between): an item
            # queued after it starts a writer of its own, and none is left behind.
            self._writing -= 1

    def _take(self) -> list[tuple[T, asyncio.Future[R]]]:
        batch: list[tuple[T, asyncio.Future[R]]] = []
        keys: set[Hashable] = set()
        later: list[tuple[T, asyncio.Future[R]]] = []
        while self._queue and len(batch) < self._max_batch:
            item, future = self._queue.popleft()
            if future.done():
                continue  # its caller gave up before it was written
            key = self._key(item)
            if key in keys:
                later.append((item, future))
                continue
            keys.add(key)
            batch.append((item, future))
        self._queue.extendleft(reversed(later))
        return batch

    async def _deliver(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._write([item for item, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            if len(batch) == 1:
                if not batch[0][1].done():
                    batch[0][1].set_exception(exc)
                return
            # One bad item fails the whole statement: write each alone, so that every caller
            # gets its own outcome and no good item fails for another's fault.
            for one in batch:
                await self._deliver([one])
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
