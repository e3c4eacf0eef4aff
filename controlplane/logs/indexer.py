"""Log search's indexer: copies the lines writers stored into the search's indexed table.

Writers store lines without the search's indexes on their path (migrations/0035); each
statement's lines are queued, and the indexer copies them in bulk behind the writers. Searches
read the copied and the queued lines alike, so they are exact whatever the indexer's lag; the
lag costs them only time (queued lines are matched one by one).
"""

from __future__ import annotations

import time
from typing import Final

from controlplane.database import Executor
from controlplane.queries import Q

BATCH_LINES: Final = 10_000
"""Lines one call copies, in one transaction (whole queued ranges: a writer's batch is one)."""


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
