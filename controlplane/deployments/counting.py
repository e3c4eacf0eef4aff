"""Counting the synchronous predictions the direct path answers, off their path: each answer
leaves its task's row (and its batches', and the result to memoize) with a writer that records
what has gathered in one transaction (group commit) while the requests go on. The rows are the
queue's (`serving_tasks`, `serving_batches`, `serving_memo`), so figures, audit views and
`GET /v1/tasks/{id}` read a direct task as any other.

What this promises: every direct answer is recorded once, moments after it is given, through
Postgres outages (the writer retries); a graceful shutdown writes everything before the pool
closes (`stop`, then the writer's `run` returns once it has written all). A kill -9 of the
control plane loses the rows of the answers it gave in its last moments (never an answer:
those were given), which is what a synchronous request's durability is: its client holds the
result. Readers in this process that must see their own writes (figures, a task read back)
`flush` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from controlplane.database import DATABASE_ERRORS
from controlplane.queries import Q

log = logging.getLogger(__name__)

MAX_GROUP = 1000
"""The most tasks one transaction records (a bound on a statement's arrays)."""
GATHER_S = 0.02
"""How long the writer, woken by an answer, lets more gather before it writes (unless a reader
flushes, or the process stops): one request at a time, each answer would be a transaction of
its own, four round trips whose work Postgres does on the CPUs the next requests need."""
RETRY_S = 0.5

Row = TypeVar("Row")


@dataclass(frozen=True, slots=True)
class CountedTask:
    task_id: UUID
    tenant: str
    deployment: str
    items: int
    input: str | None
    """JSON text; None for a memo hit, whose `memo_key` names its input (kept as JSON null: no
    reader of a finished task reads its input, and a copy of each hit's would cost Postgres
    more than the rest of its row)."""
    state: str
    output: str | None
    error: str | None
    memo: str
    memo_key: bytes | None
    replica: UUID | None
    tries: int
    submitted_at: datetime
    finished_at: datetime
    step_times: str
    """JSON text: a list of one step's times (none for a memo hit)."""


@dataclass(frozen=True, slots=True)
class CountedBatch:
    batch_id: UUID
    tenant: str
    deployment: str
    replica: UUID
    tasks: int
    items: int
    reason: str
    outcome: str
    invocation_ms: float
    inference_ms: float | None
    at: datetime


@dataclass(frozen=True, slots=True)
class MemoUse:
    """A result to memoize, or a durable memo entry used (its use time moves)."""

    tenant: str
    deployment: str
    key: bytes
    output: str
    at: datetime


class Counting:
    """One per control plane process: `record` from the requests, `run` in the background."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._tasks: list[CountedTask] = []
        self._batches: dict[UUID, CountedBatch] = {}
        self._memo: dict[tuple[str, str, bytes], MemoUse] = {}
        self._recorded = 0
        """Tasks handed in so far."""
        self._written = 0
        """Tasks written so far (in the order handed in)."""
        self._wake = asyncio.Event()
        self._hurry = asyncio.Event()
        """A reader flushes, or the process stops: what has gathered is written at once."""
        self._stopping = asyncio.Event()
        self._ended = False
        self._progress = asyncio.Condition()

    def record(
        self, task: CountedTask, batches: tuple[CountedBatch, ...] = (), memo: MemoUse | None = None
    ) -> None:
        """Hand in an answered task (with its batches, and its memo entry) to be written."""
        self._tasks.append(task)
        for batch in batches:
            self._batches.setdefault(batch.batch_id, batch)  # each batch once per group
        if memo is not None:
            self._memo[(memo.tenant, memo.deployment, memo.key)] = memo  # the latest use
        self._recorded += 1
        self._wake.set()

    async def flush(self) -> None:
        """Return once every task handed in before the call is written (or the writer ended)."""
        target = self._recorded
        self._hurry.set()
        async with self._progress:
            await self._progress.wait_for(lambda: self._written >= target or self._ended)

    async def run(self) -> None:
        """Write what gathers, a group at a time, until `stop()` and everything is written."""
        try:
            while True:
                if not self._tasks and not self._batches and not self._memo:
                    if self._stopping.is_set():
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(GATHER_S):
                        await self._hurry.wait()
                self._hurry.clear()
                tasks, batches, memo = self._take()
                try:
                    await self._write(tasks, batches, memo)
                except DATABASE_ERRORS as exc:
                    log.warning(
                        "direct predictions: recording %d failed (%s); retrying", len(tasks), exc
                    )
                    self._give_back(tasks, batches, memo)
                    await asyncio.sleep(RETRY_S)
                    continue
                async with self._progress:
                    self._written += len(tasks)
                    self._progress.notify_all()
        finally:
            async with self._progress:
                self._ended = True
                self._progress.notify_all()

    def stop(self) -> None:
        """Write what is left, then end `run`."""
        self._stopping.set()
        self._hurry.set()
        self._wake.set()

    def _take(self) -> tuple[list[CountedTask], list[CountedBatch], list[MemoUse]]:
        most = MAX_GROUP
        tasks, self._tasks = self._tasks[:most], self._tasks[most:]
        batches = list(self._batches.values())
        batches, self._batches = batches[:most], {b.batch_id: b for b in batches[most:]}
        memo = list(self._memo.items())
        self._memo = dict(memo[most:])
        return tasks, batches, [use for _, use in memo[:most]]

    def _give_back(
        self, tasks: list[CountedTask], batches: list[CountedBatch], memo: list[MemoUse]
    ) -> None:
        self._tasks[:0] = tasks
        for batch in batches:
            self._batches.setdefault(batch.batch_id, batch)
        for use in memo:
            self._memo.setdefault((use.tenant, use.deployment, use.key), use)

    async def _write(
        self, tasks: list[CountedTask], batches: list[CountedBatch], memo: list[MemoUse]
    ) -> None:
        """The group in one transaction: as it is first (a statement per kind, no savepoint:
        each costs two more round trips, each a wake-up of Postgres and of this event loop,
        while the requests go on); when Postgres refuses a row, again with each kind in a
        savepoint of its own (`_insert`), so that the row is left out alone."""
        async with self._pool.acquire() as conn:
            try:
                async with conn.transaction():
                    for query, rows, columns in _kinds(tasks, batches, memo):
                        await conn.execute(Q[query], *columns(rows))
                return
            except asyncpg.DataError:
                pass  # rare: agents clean what a replica answers
            async with conn.transaction():
                for query, rows, columns in _kinds(tasks, batches, memo):
                    await _insert(conn, query, rows, columns)


Kind = tuple[str, list[Any], Callable[[list[Any]], list[list[Any]]]]


def _kinds(
    tasks: list[CountedTask], batches: list[CountedBatch], memo: list[MemoUse]
) -> list[Kind]:
    """Each kind of row the group holds: its statement, its rows, and their columns."""
    kinds: list[Kind] = [
        ("record_direct_tasks", tasks, _task_columns),
        ("record_direct_batches", batches, _batch_columns),
        ("record_direct_memo", memo, _memo_columns),
    ]
    return [kind for kind in kinds if kind[1]]


async def _insert(
    conn: asyncpg.Connection | PoolConnectionProxy,
    query: str,
    rows: list[Row],
    columns: Callable[[list[Row]], list[list[Any]]],
) -> None:
    """`rows` written by `query`, in a savepoint of their own: a row Postgres refuses for what
    it holds (a tenant's text: a NUL, an unpaired surrogate) is left out alone, with a log line,
    and holds back neither the other rows of its kind nor those of the other kinds (another
    tenant's, as likely as not). Retried as it is, it would hold back every row after it."""
    try:
        async with conn.transaction():
            await conn.execute(Q[query], *columns(rows))
        return
    except asyncpg.DataError:
        pass  # one at a time, to find which
    for row in rows:
        try:
            async with conn.transaction():
                await conn.execute(Q[query], *columns([row]))
        except asyncpg.DataError as exc:
            log.error("direct predictions: a row cannot be recorded, left out: %s: %r", exc, row)


def _task_columns(tasks: list[CountedTask]) -> list[list[Any]]:
    return [
        [t.task_id for t in tasks],
        [t.tenant for t in tasks],
        [t.deployment for t in tasks],
        [t.items for t in tasks],
        [t.input for t in tasks],
        [t.state for t in tasks],
        [t.output for t in tasks],
        [t.error for t in tasks],
        [t.memo for t in tasks],
        [t.memo_key for t in tasks],
        [t.replica for t in tasks],
        [t.tries for t in tasks],
        [t.submitted_at for t in tasks],
        [t.finished_at for t in tasks],
        [t.step_times for t in tasks],
    ]


def _batch_columns(batches: list[CountedBatch]) -> list[list[Any]]:
    return [
        [b.batch_id for b in batches],
        [b.tenant for b in batches],
        [b.deployment for b in batches],
        [b.replica for b in batches],
        [b.tasks for b in batches],
        [b.items for b in batches],
        [b.reason for b in batches],
        [b.outcome for b in batches],
        [b.invocation_ms for b in batches],
        [b.inference_ms for b in batches],
        [b.at for b in batches],
    ]


def _memo_columns(memo: list[MemoUse]) -> list[list[Any]]:
    return [
        [m.tenant for m in memo],
        [m.deployment for m in memo],
        [m.key for m in memo],
        [m.output for m in memo],
        [m.at for m in memo],
    ]
