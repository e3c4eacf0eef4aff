"""A request whose client went away, as both ends of a synchronous prediction's direct path see
it: the control plane's predict handler (its client: the tenant) and the agent's serving channel
(its client: the control plane). aiohttp tells a handler nothing when its connection closes
(handler cancellation is off, and must stay off for the handlers that write events before they
answer), so a handler that holds a replica's room while it waits looks at its transport: a
request that went away before its batch left never reaches the replica."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

GONE_POLL_S = 0.05
"""How often a waiting request looks whether its client is still connected: the control plane's
look and then the agent's, well within issue 35's 200 ms for a request to stop using a
replica."""
CLIENT_GONE = 499
"""The status recorded (in access logs and figures; no one reads it) for a request whose client
went away before its answer, as nginx records it."""

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class _Waiting:
    request: web.Request
    task: asyncio.Task[Any]
    gone: bool = False


class _Lookout:
    """The requests of one event loop waiting in `unless_gone`, looked at together each
    GONE_POLL_S: one timer for them all, not one per request, which under hundreds of waiting
    requests is thousands of timers a second."""

    def __init__(self) -> None:
        self.waiting: set[_Waiting] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, waiting: _Waiting) -> None:
        self.waiting.add(waiting)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(GONE_POLL_S, self._look)

    def _look(self) -> None:
        self._timer = None
        for waiting in self.waiting:
            transport = waiting.request.transport
            if not waiting.gone and (transport is None or transport.is_closing()):
                waiting.gone = True
                waiting.task.cancel()  # it leaves `waiting` as it ends, not in this loop
        if self.waiting:
            self._timer = asyncio.get_running_loop().call_later(GONE_POLL_S, self._look)


_LOOKOUTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lookout] = (
    weakref.WeakKeyDictionary()
)


async def unless_gone(request: web.Request, work: Awaitable[T]) -> T | None:
    """`work`'s result; None when the request's client went away first, and `work` was
    cancelled for it. Cancelled as `asyncio.timeout` cancels: this task, and only its own
    cancellation is taken back; any other propagates."""
    me = asyncio.current_task()
    assert me is not None  # a handler runs in its task
    loop = asyncio.get_running_loop()
    lookout = _LOOKOUTS.get(loop)
    if lookout is None:
        lookout = _LOOKOUTS[loop] = _Lookout()
    waiting = _Waiting(request, me)
    lookout.add(waiting)
    try:
        return await work
    except asyncio.CancelledError:
        if waiting.gone and me.uncancel() == 0:
            return None
        raise
    finally:
        lookout.waiting.discard(waiting)
