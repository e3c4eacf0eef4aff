"""Waking readers of the global log: LISTEN/NOTIFY as a hint, polling as the guarantee.

A NOTIFY carries nothing that matters; it only says "read again". Every waiter also wakes after
`poll_interval`, so a lost notification (or a dropped listening connection) costs latency,
never an event. After the listening connection drops, the listener reconnects, LISTENs again
and wakes every waiter so that they catch up on whatever committed meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

import asyncpg

from controlplane.database import (
    APP_ROLE,
    DATABASE_ERRORS,
    DatabaseUnavailable,
    Role,
    connect,
)
from controlplane.events.recorder import EventRecorder
from controlplane.events.records import LogPosition, RecordedEvent
from controlplane.workers import pause

CHANNEL = "trainyard_events"
log = logging.getLogger(__name__)


HELD_BACK_S = (0.002, 1.0)
"""How soon a reader looks again at news held back, at first and at the latest."""


@dataclass(slots=True)
class HeldBack:
    """How soon a reader of the log looks again while news is held back (`LogBatch.held_back`):
    soon, as the transaction holding it is usually a few milliseconds from its end, then twice
    as late each time, up to the poll interval, so that a long one (a rebuild) costs a few reads
    and not one every few milliseconds."""

    _next_s: float = HELD_BACK_S[0]

    def within(self, held_back: bool) -> float | None:
        """The most to wait after a read that found news `held_back` or not (None: until
        notified, as ever)."""
        if not held_back:
            self._next_s = HELD_BACK_S[0]
            return None
        within, self._next_s = self._next_s, min(2 * self._next_s, HELD_BACK_S[1])
        return within


class LogListener:
    """One LISTEN connection per process, shared by every reader that waits for new events.

    `channel` is `trainyard_events` (appends) unless a reader waits for another hint, as the
    webhook relay does for new deliveries (`trainyard_webhooks`). `also` names more channels
    to LISTEN on over the same connection (a node agent's two: a connection each would be a
    thousand more for a thousand nodes); `notified(channel)` then tells which of them woke it.
    """

    def __init__(
        self,
        url: str,
        *,
        channel: str = CHANNEL,
        also: Sequence[str] = (),
        poll_interval: float = 1.0,
        retry_interval: float = 1.0,
        role: Role = APP_ROLE,
    ) -> None:
        self._url = url
        self._role: Role = role
        self.channels = (channel, *also)
        self.poll_interval = poll_interval
        self._retry_interval = retry_interval
        self._generation = 0
        self._notified: Counter[str] = Counter()
        self._woken = asyncio.Event()
        self._dropped = asyncio.Event()
        self._stopping = asyncio.Event()
        self.connection: asyncpg.Connection | None = None
        self.connected = asyncio.Event()

    @property
    def generation(self) -> int:
        """Counts wake-ups; a reader remembers it before reading and waits for it to change."""
        return self._generation

    def notified(self, channel: str) -> int:
        """Counts the notifications of `channel`; each one also counts as a wake-up. A wake-up
        that no channel counts (a reconnect: notifications may have been missed) means all."""
        return self._notified[channel]

    async def wait(self, seen: int, within: float | None = None) -> None:
        """Return once woken after generation `seen`, or after the poll interval (or `within`
        seconds, when sooner) at most."""
        if self._generation != seen:
            return
        await pause(
            self._woken, self.poll_interval if within is None else min(within, self.poll_interval)
        )

    def wake(self) -> None:
        """Wake every waiter; a fresh Event for the next round, so each wake is seen once."""
        self._generation += 1
        woken, self._woken = self._woken, asyncio.Event()
        woken.set()

    async def run(self) -> None:
        """Hold the LISTEN connection until `stop()`, reconnecting whenever it drops."""
        while not self._stopping.is_set():
            try:
                await self._listen_once()
            except (DatabaseUnavailable, *DATABASE_ERRORS) as exc:
                # Listening is only a hint: readers poll meanwhile, and are woken below.
                log.warning(
                    "listener on %s: %s; retrying in %.1fs", self.name, exc, self._retry_interval
                )
            # Whatever happened while we were not listening, readers must look again.
            self.wake()
            await pause(self._stopping, self._retry_interval)

    @property
    def name(self) -> str:
        """Its channels, for messages and task names."""
        return "+".join(self.channels)

    def stop(self) -> None:
        self._stopping.set()

    async def _listen_once(self) -> None:
        conn = await connect(self._url, role=self._role)
        self._dropped.clear()
        conn.add_termination_listener(lambda _: self._dropped.set())
        try:
            for channel in self.channels:
                await conn.add_listener(channel, self._on_notify)
            self.connection = conn
            self.connected.set()
            # Catch up on what committed before LISTEN took effect.
            self.wake()
            stop = asyncio.create_task(self._stopping.wait())
            dropped = asyncio.create_task(self._dropped.wait())
            try:
                await asyncio.wait({stop, dropped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                dropped.cancel()
            if self._dropped.is_set():
                log.warning("listener on %s: connection dropped; reconnecting", self.name)
        finally:
            self.connected.clear()
            self.connection = None
            if not conn.is_closed():
                # Shielded: a cancelled shutdown must still give the connection back.
                await asyncio.shield(conn.close(timeout=5))

    def _on_notify(self, _conn: object, _pid: object, channel: str, _payload: object) -> None:
        self._notified[channel] += 1
        self.wake()


async def follow(
    store: EventRecorder, listener: LogListener, after: LogPosition, *, batch: int = 500
) -> AsyncGenerator[RecordedEvent, None]:
    """Every event after `after`, forever, in global order, waiting for new ones as they come."""
    position = after
    while True:
        seen = listener.generation
        events = await store.read_log(position, batch)
        for event in events:
            yield event
            position = event.log_position
        if len(events) < batch:
            await listener.wait(seen)
