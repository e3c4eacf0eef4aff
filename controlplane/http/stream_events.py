"""Following one stream's events over SSE (a job's, a search's): what was recorded, then what
is appended, each event once and in version order, whatever the hub delivers twice or drops."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from controlplane.events.hub import Lagged
from controlplane.events.records import RecordedEvent
from controlplane.http.keys import HUB, SSE_HEARTBEAT_S


class Sender(Protocol):
    """Writes a stream's events as SSE; skips those at or below `version`."""

    @property
    def version(self) -> int: ...

    @property
    def finished(self) -> bool:
        """Whether the stream's last event has been sent (the job, the search ended)."""
        ...

    async def send(self, recorded: RecordedEvent) -> None: ...


async def follow(
    request: web.Request,
    response: web.StreamResponse,
    stream_id: str,
    history: Callable[[], Awaitable[list[RecordedEvent]]],
    sender: Sender,
) -> None:
    """Send `stream_id`'s events (read by `history`), then each new one, until the sender is
    finished or the server shuts down; a comment heartbeat while idle."""
    # Subscribed before the past is read, so nothing committed in between is missed; the
    # versions already sent filter out what arrives twice.
    with request.app[HUB].subscribe(stream_id) as subscription:
        for recorded in await history():
            await sender.send(recorded)
        while not sender.finished:
            try:
                async with asyncio.timeout(request.app[SSE_HEARTBEAT_S]):
                    item = await subscription.next()
            except TimeoutError:
                await response.write(b": heartbeat\n\n")
                continue
            if item is None:  # the server is shutting down
                break
            if isinstance(item, Lagged) or item.stream_version > sender.version + 1:
                for recorded in await history():
                    await sender.send(recorded)
            else:
                await sender.send(item)
