"""What serving keeps, bounded by two steps of the lifecycle manager's sweep: each deployment's
memo its `memo_max_entries` most recently used results, and finished tasks (and their batches)
the task retention."""

from __future__ import annotations

import asyncpg

from controlplane.queries import Q
from controlplane.sweeps import Tenure

TASK_RETENTION_S = 24 * 3600.0
"""How long finished serving tasks (and their batches) are kept: their results readable, their
figures counted."""


class MemoEviction:
    """The sweep of memoized results past their deployment's bound."""

    name = "memo-eviction"

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def step(self, tenure: Tenure) -> None:
        await self._pool.execute(Q["evict_memo"])


class TaskRetention:
    """The sweep of finished tasks past the retention."""

    name = "task-retention"

    def __init__(self, pool: asyncpg.Pool, retention_s: float = TASK_RETENTION_S) -> None:
        self._pool = pool
        self._retention_s = retention_s

    async def step(self, tenure: Tenure) -> None:
        await self._pool.execute(Q["forget_tasks"], self._retention_s)
