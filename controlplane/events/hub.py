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
from collections import Counter, defaultdict
from collections.abc import Iterator

from controlplane.database import DATABASE_ERRORS
from controlplane.events.recorder import EventRecorder
from controlplane.events.records import LogPosition, RecordedEvent, category_of
from controlplane.events.subscription import HeldBack, LogListener
from controlplane.workers import pause

log = logging.getLogger(__name__)

QUEUE_LIMIT = 1000
RETRY_S = 1.0
BATCH = 500
"""The most events the hub reads of the log at once."""


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
        self._categories: Counter[str] = Counter()
        """How many subscriptions each stream category has: the events the hub decodes."""
        self._position: LogPosition | None = None
        self._stopping = asyncio.Event()

    @contextlib.contextmanager
    def subscribe(self, stream_id: str) -> Iterator[Subscription]:
        subscription = Subscription(stream_id)
        category = category_of(stream_id)
        self._subscribers[stream_id].add(subscription)
        self._categories[category] += 1
        try:
            yield subscription
        finally:
            watchers = self._subscribers[stream_id]
            watchers.discard(subscription)
            if not watchers:
                del self._subscribers[stream_id]
            self._categories[category] -= 1
            if not self._categories[category]:
                del self._categories[category]

    async def run(self) -> None:
        """Follow the log from its current tail and hand each event to its stream's watchers,
        until `stop()`; then end every open stream."""
        try:
            while not self._stopping.is_set():
                try:
                    await self._forward()
                except DATABASE_ERRORS as exc:
                    # Resume after the last batch handed out: none is skipped or sent twice
                    # (and a subscriber that lags re-reads the store anyway).
                    log.warning("SSE hub: %s; resuming in %.1fs", exc, RETRY_S)
                    await pause(self._stopping, RETRY_S)
        finally:
            # Close every open stream: their handlers end their responses cleanly.
            for watchers in self._subscribers.values():
                for subscription in watchers:
                    subscription.offer(None)

    async def _forward(self) -> None:
        """Hand out the events after the hub's place (at first, the log's tail), a batch at a
        time, until stopped."""
        position = self._position if self._position is not None else await self._store.log_tail()
        held_back = HeldBack()
        while not self._stopping.is_set():
            seen = self._listener.generation
            # Only the events of streams someone follows are decoded: with no stream open (a
            # burst of submits), the hub reads where the log ends and nothing else.
            wanted = set(self._categories)
            batch = await self._store.read_log_of(wanted, position, BATCH)
            for event in batch.events:
                for subscription in self._subscribers.get(event.stream_id, ()):
                    subscription.offer(event)
            joined = self._categories.keys() - wanted
            if joined and batch.read:
                # Subscribed while the batch was read: its events of their streams were not
                # decoded, and may be past what they read of their stream's past.
                for stream_id, watchers in self._subscribers.items():
                    if category_of(stream_id) in joined:
                        for subscription in watchers:
                            subscription.offer(LAGGED)
            position = self._position = batch.end
            if batch.read < BATCH:
                await self._listener.wait(seen, held_back.within(batch.held_back))

    def stop(self) -> None:
        self._stopping.set()
        self._listener.wake()  # out of its wait for news, now
