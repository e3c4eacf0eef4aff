"""The search driver: a background worker of every control plane replica that drives searches
on as their trials' jobs end. It wakes with the log (an appended JobCompleted wakes it at once,
so the next trial is submitted within milliseconds of the last one's end), and polls besides.

Several replicas may drive the same search at once: each step appends at the version it was
decided on, so one of two concurrent steps conflicts and leaves it to the other, and each job
command is idempotent. A replica killed at any moment leaves nothing the next drive does not
finish (see `service`)."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from controlplane.database import DATABASE_ERRORS
from controlplane.events.subscription import LogListener
from controlplane.queries import Q
from controlplane.searches.service import Searches
from controlplane.workers import isolated

log = logging.getLogger(__name__)


class SearchDriver:
    def __init__(self, pool: asyncpg.Pool, searches: Searches, listener: LogListener) -> None:
        self._pool = pool
        self._searches = searches
        self._listener = listener
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Stop after the round in progress; the caller wakes the listener to end its wait."""
        self._stopping.set()

    async def run(self) -> None:
        while not self._stopping.is_set():
            seen = self._listener.generation
            try:
                await self.round()
            except DATABASE_ERRORS as exc:
                log.warning("driving searches failed: %s; retrying", exc)
            if self._stopping.is_set():
                return
            await self._listener.wait(seen)

    async def round(self) -> int:
        """Drive every search that has something to record or carry out; how many."""
        ids = [row["search_id"] for row in await self._pool.fetch(Q["searches_to_drive"])]
        for search_id in ids:
            # One search's bug (or bad data) must not stop the others' trials.
            await isolated("search-driver", f"search {search_id}", self._searches.drive(search_id))
        return len(ids)
