"""The serving channel's wake-ups, by what each notification names: a deployment's queue (its
replicas' feeds wait for that) or RESULTS (the API's waiting requests wait for that), so that a
task queued for one deployment wakes that deployment's feeds alone, and a result wakes no feed.

A notification is still only a hint: every waiter also wakes after the poll interval, and a
reconnect of the listening connection wakes every key (LogListener's guarantees)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence

from controlplane.database import APP_ROLE, Role
from controlplane.events.subscription import LogListener

CHANNEL = "serving"
RESULTS = "results"
"""The payload of a task finished (succeeded or failed)."""
INFERENCE = "inference"
"""The payload of an inference job's query started or finished: the replicas of the jobs
taking queries wait for that to take their turn (controlplane/inference)."""


def queue_key(tenant: str, deployment: str) -> str:
    """The payload of a task queued for `deployment` (as queries.sql writes it)."""
    return f"{tenant}.{deployment}"


Seen = tuple[int, int]


class Wakeups(LogListener):
    """`also`: more channels on the same connection, each counted as LogListener counts them
    (a node agent's claim and request hints: one LISTEN connection per agent, not two).

    `listen` False: no LISTEN connection at all, so nothing is notified and every waiter wakes
    after the poll interval (a node agent that polls, so that a fleet of them needs no server
    connection each: docs/operations.md, "Connection budget")."""

    def __init__(
        self,
        url: str,
        *,
        poll_interval: float,
        role: Role = APP_ROLE,
        also: Sequence[str] = (),
        listen: bool = True,
    ) -> None:
        super().__init__(url, channel=CHANNEL, also=also, poll_interval=poll_interval, role=role)
        self.listens = listen
        self._counts: defaultdict[str, int] = defaultdict(int)
        self._events: dict[str, asyncio.Event] = {}

    async def run(self) -> None:
        if self.listens:
            await super().run()
            return
        # Nothing to hold: waiters poll. Until `stop()`, as a listener runs.
        await self._stopping.wait()

    def _on_notify(self, _conn: object, _pid: object, channel: str, _payload: object) -> None:
        if channel != CHANNEL:
            super()._on_notify(_conn, _pid, channel, _payload)
            return
        key = str(_payload)
        self._counts[key] += 1
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def seen(self, key: str) -> Seen:
        """What to remember before reading, and to wait with after."""
        return self.generation, self._counts[key]

    async def wait_for(self, key: str, seen: Seen) -> None:
        """Return once `key` was notified (or every key woken) after `seen`, or after the poll
        interval at most."""
        if self.seen(key) != seen:
            return
        keyed = asyncio.ensure_future(self._events.setdefault(key, asyncio.Event()).wait())
        general = asyncio.ensure_future(self.wait(seen[0]))
        try:
            await asyncio.wait({keyed, general}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            keyed.cancel()
            general.cancel()
