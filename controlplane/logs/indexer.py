"""Log search's indexer: copies the lines writers stored into the search's indexed table.

Writers store lines without the search's indexes on their path (migrations/0035); each
statement's lines are queued, and the indexer copies them in bulk behind the writers. Searches
read the copied and the queued lines alike, so they are exact whatever the indexer's lag; the
lag costs them only time (queued lines are matched one by one).

`LogIndexers` is the control plane's background worker: `count` indexers per replica, each
copying batches while the queue has lines. Each batch takes its queued ranges FOR UPDATE SKIP
LOCKED, one at a time (migration 0036), so any number of indexers, in one replica or in
several, take different ranges and never wait for one another's. What they do take in turn is
the trigram index's pending list (each appends its lines' entries under the index's metapage
lock, and merges the list at the end of its batch), so with that index several indexers copy
about as fast as one; without it two copied 1.6 times as fast on 2 cores (docs/log-search.md).

An idle indexer polls the queue every POLL_S rather than waiting for a NOTIFY from the queue's
trigger: NOTIFY takes a database-wide lock at commit, and one per writer's statement halved the
statements a server committed for 100-line statements (8,544 and 9,727 a second without it,
4,085 and 5,062 with it: 8 writers, pgbench, two runs each); at 5,000-line statements it was
lost in the noise. Agents ship small statements, and writers must not pay for the indexer's
wake-ups; a poll costs one empty statement per indexer every POLL_S, and the lag it adds is
time only (searches stay exact).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from typing import Final

import asyncpg

from controlplane.database import DATABASE_ERRORS, Executor
from controlplane.queries import Q
from controlplane.workers import pause

log = logging.getLogger(__name__)

BATCH_LINES: Final = 10_000
"""Lines one call copies, in one transaction (whole queued ranges: a writer's batch is one)."""
POLL_S: Final = 0.25
"""How long an indexer that found the queue empty waits before looking again."""
RETRY_S: Final = 1.0
"""How long an indexer waits after the database failed it (down, failing over) to try again."""
LOG_INDEXERS_ENV: Final = "TRAINYARD_LOG_INDEXERS"
DEFAULT_LOG_INDEXERS: Final = 2
"""Indexers per control plane replica: one copies some 50,000 lines/s over the benchmark's log
(docs/log-search.md); a second copied no slower with the trigram index and 1.6 times as fast
without it, and takes over while the first waits on its batch."""
MAX_LOG_INDEXERS: Final = 64


def log_indexers_from_env(environ: Mapping[str, str] = os.environ) -> int:
    """Indexers this replica runs: LOG_INDEXERS_ENV, else DEFAULT_LOG_INDEXERS; ValueError,
    saying what is wrong, for anything but a whole number from 0 (none here: other replicas
    index) to MAX_LOG_INDEXERS."""
    raw = environ.get(LOG_INDEXERS_ENV, "").strip()
    if not raw:
        return DEFAULT_LOG_INDEXERS
    try:
        count = int(raw)
    except ValueError:
        count = -1
    if not 0 <= count <= MAX_LOG_INDEXERS:
        raise ValueError(
            f"{LOG_INDEXERS_ENV} must be a whole number from 0 to {MAX_LOG_INDEXERS}, not {raw!r}"
        )
    return count


async def index_queued_lines(db: Executor, *, budget_s: float) -> int:
    """Copy queued lines, BATCH_LINES a transaction, until the queue is empty or `budget_s`
    has passed (the call under way finishes); how many lines were copied."""
    copied = 0
    deadline = time.monotonic() + budget_s
    while True:
        lines: int = await db.fetchval(Q["index_job_log_lines"], BATCH_LINES)
        copied += lines
        if lines < BATCH_LINES or time.monotonic() >= deadline:
            return copied


class LogIndexers:
    """`count` indexers on `pool`, siblings that stop together: `run()` until `stop()`. A stop
    lets each finish the batch under way; a cancellation rolls it back (its ranges stay queued,
    and searches still find their lines)."""

    def __init__(self, pool: asyncpg.Pool, *, count: int, poll_s: float = POLL_S) -> None:
        self._pool = pool
        self.count = count
        self._poll_s = poll_s
        self._stopping = asyncio.Event()
        self.copied = 0
        """Lines this replica's indexers copied since they started."""

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for number in range(self.count):
                group.create_task(self._index(), name=f"log-indexer-{number}")

    async def _index(self) -> None:
        while not self._stopping.is_set():
            try:
                lines: int = await self._pool.fetchval(Q["index_job_log_lines"], BATCH_LINES)
            except DATABASE_ERRORS as exc:
                # Raised, it would end the replica's every background task; the queue keeps
                # the lines meanwhile.
                log.warning("log indexer: %s; retrying", exc)
                await pause(self._stopping, RETRY_S)
                continue
            self.copied += lines
            if not lines:
                await pause(self._stopping, self._poll_s)
