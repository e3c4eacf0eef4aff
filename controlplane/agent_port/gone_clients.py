"""A request whose client went away, as both ends of a synchronous prediction's direct path see
it: the control plane's predict handler (its client: the tenant) and the agent's serving channel
(its client: the control plane). aiohttp tells a handler nothing when its connection closes
(handler cancellation is off, and must stay off for the handlers that write events before they
answer), so a handler that holds a replica's room while it waits looks at its transport: a
request that went away before its batch left never reaches the replica."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from aiohttp import web

GONE_POLL_S = 0.05
"""How often a waiting request looks whether its client is still connected: the control plane's
look and then the agent's, well within issue 35's 200 ms for a request to stop using a
replica."""
CLIENT_GONE = 499
"""The status recorded (in access logs and figures; no one reads it) for a request whose client
went away before its answer, as nginx records it."""

T = TypeVar("T")


async def unless_gone(request: web.Request, work: Awaitable[T]) -> T | None:
    """`work`'s result; None when the request's client went away first, and `work` was
    cancelled for it. Cancelled as `asyncio.timeout` cancels: this task, and only its own
    cancellation is taken back; any other propagates."""
    me = asyncio.current_task()
    assert me is not None  # a handler runs in its task
    loop = asyncio.get_running_loop()
    gone = False
    timer: asyncio.TimerHandle  # the next look

    def look() -> None:
        nonlocal gone, timer
        transport = request.transport
        if transport is None or transport.is_closing():
            gone = True
            me.cancel()
        else:
            timer = loop.call_later(GONE_POLL_S, look)

    timer = loop.call_later(GONE_POLL_S, look)
    try:
        return await work
    except asyncio.CancelledError:
        if gone and me.uncancel() == 0:
            return None
        raise
    finally:
        timer.cancel()
