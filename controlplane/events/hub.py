"""In-process fan-out of the global log to per-stream subscribers (SSE clients).

One follower reads the log for the whole process, however many clients watch, so a thousand
open streams cost one query per wake-up, not a thousand. A subscriber first reads its stream's
past from the store and then takes live events from the hub, skipping versions it has already
sent; one that falls too far behind is told to re-read from the store instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator

from controlplane.database import DATABASE_ERRORS
from controlplane.events.recorder import EventRecorder
from controlplane.events.records import LogPosition, RecordedEvent
from controlplane.events.subscription import LogListener, follow
from controlplane.workers import pause

log = logging.getLogger(__name__)

QUEUE_LIMIT = 1000
RETRY_S = 1.0


class Lagged:
    """Put in a subscriber's queue instead of events it missed: re-read the store."""


LAGGED = Lagged()


class Subscription:
    def __init__(self, stream_id: str) -> None:
        self.stream_id = stream_id
        self.queue: asyncio.Queue[RecordedEvent | Lagged | None] = asyncio.Queue(QUEUE_LIMIT + 1)

    def offer(self, item: RecordedEvent | Lagged | None) -> None:
        if self.queue.qsize() >= QUEUE_LIMIT and item is not None:
            # Too slow a reader: drop what is queued, it re-reads the store from its version.
            while not self.queue.empty():
                self.queue.get_nowait()
            item = LAGGED
        self.queue.put_nowait(item)

    async def next(self) -> RecordedEvent | Lagged | None:
        """The next event; LAGGED when it must re-read the store; None when the hub closes."""
        return await self.queue.get()


class StreamHub:
    def __init__(self, store: EventRecorder, listener: LogListener) -> None:
        self._store = store
        self._listener = listener
        self._subscribers: defaultdict[str, set[Subscription]] = defaultdict(set)
        self._stopping = asyncio.Event()

    @contextlib.contextmanager
    def subscribe(self, stream_id: str) -> Iterator[Subscription]:
        subscription = Subscription(stream_id)
        self._subscribers[stream_id].add(subscription)
        try:
            yield subscription
        finally:
            watchers = self._subscribers[stream_id]
            watchers.discard(subscription)
            if not watchers:
                del self._subscribers[stream_id]

    async def run(self) -> None:
        """Follow the log from its current tail and hand each event to its stream's watchers,
        until `stop()`; then end every open stream."""
        try:
            position: LogPosition | None = None
            while not self._stopping.is_set():
                try:
                    if position is None:
                        position = await self._store.log_tail()
                    position = await self._forward(position)
                except DATABASE_ERRORS as exc:
                    # Resume from the last event handed out: none is skipped or sent twice
                    # (and a subscriber that lags re-reads the store anyway).
                    log.warning("SSE hub: %s; resuming in %.1fs", exc, RETRY_S)
                    await pause(self._stopping, RETRY_S)
        finally:
            # Close every open stream: their handlers end their responses cleanly.
            for watchers in self._subscribers.values():
                for subscription in watchers:
                    subscription.offer(None)

    async def _forward(self, position: LogPosition) -> LogPosition:
        """Hand out events after `position` until stopped; returns the last one handed out."""
        events = follow(self._store, self._listener, position)
        stopping = asyncio.ensure_future(self._stopping.wait())
        following: asyncio.Future[RecordedEvent] | None = None
        try:
            while True:
                following = asyncio.ensure_future(anext(events))
                done, _ = await asyncio.wait(
                    {following, stopping}, return_when=asyncio.FIRST_COMPLETED
                )
                if following not in done:
                    return position
                event = following.result()
                for subscription in self._subscribers.get(event.stream_id, ()):
                    subscription.offer(event)
                position = event.log_position
        finally:
            stopping.cancel()
            if following is not None and not following.done():
                # The generator cannot be closed while a step of it is still running.
                following.cancel()
                await asyncio.wait({following})
            await events.aclose()

    def stop(self) -> None:
        self._stopping.set()
