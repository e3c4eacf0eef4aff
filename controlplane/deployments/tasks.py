"""Tasks, the API's side: a prediction queued for a deployment or a pipeline (or answered from
the memo), its result waited for, and its record read back. The queue is the `serving_tasks`
table: an accepted task is a committed row, so it outlives any process; replicas take it from
there (node_agent/serving.py)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg

from controlplane.database import DATABASE_ERRORS
from controlplane.deployments.wakeups import RESULTS, Wakeups
from controlplane.jobs.manifest import check_storable
from controlplane.queries import Q
from controlplane.workers import pause

IDEMPOTENCY_NAMESPACE = uuid.UUID("9a3c1f6e-2b7d-4e05-8c41-d6f0b8e2a7c3")
"""Ids of idempotent predictions are uuid5(namespace, tenant + key): a retry finds its task."""
MAX_TRIES = 3
"""A task whose replica stops answering this many times fails (the lifecycle manager)."""


class IdempotencyMismatch(Exception):
    """An Idempotency-Key reused for another deployment or pipeline; nothing was written."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where a task goes: one deployment (memoizable) or a pipeline's deployments in order."""

    tenant: str
    steps: tuple[str, ...]
    pipeline: str | None = None
    memo_salt: str | None = None
    """What identifies the deployed model (its artifact and entry point), when its results may
    be memoized; None: they are not."""
    version: int | None = None
    """The model version chosen for it (a canary's weight): only that version's replicas claim
    it. None: the deployment's own (a pipeline's steps)."""


def memo_key(salt: str, inputs: Sequence[Any]) -> bytes:
    """The memo's key: the model (salt) and the input bytes, canonical (sorted keys, no spaces),
    so the same input however it was spaced finds the same result."""
    return canonical_memo_key(salt, canonical_json(inputs))


def canonical_json(inputs: Sequence[Any]) -> str:
    """The inputs' canonical JSON (sorted keys, no spaces, ASCII): what the memo's key hashes,
    and a JSON text of them as good as any other (ValueError for NaN and infinities)."""
    return json.dumps(inputs, sort_keys=True, separators=(",", ":"), allow_nan=False)


def canonical_memo_key(salt: str, canonical: str) -> bytes:
    """`memo_key` of the inputs whose `canonical_json` is `canonical`."""
    return hashlib.sha256(f"{salt}\n{canonical}".encode()).digest()


def new_task_id(tenant: str, idempotency_key: str | None) -> UUID:
    """A new task's id: a fresh one, or for an idempotent request the one every retry finds."""
    if idempotency_key is None:
        return uuid.uuid4()
    return uuid.uuid5(IDEMPOTENCY_NAMESPACE, f"{tenant}\n{idempotency_key}")


class Tasks:
    """Queue, answer from the memo, and wait: one instance per API process, its `run` woken by
    the `serving` channel for the results its requests wait for."""

    def __init__(self, pool: asyncpg.Pool, url: str, *, poll_interval: float = 0.5) -> None:
        self._pool = pool
        self.listener = Wakeups(url, poll_interval=poll_interval)
        self._waiting: dict[UUID, set[asyncio.Future[asyncpg.Record]]] = {}
        """Each task's waiters (a request, a stream: several may wait for one task)."""
        self._stopping = asyncio.Event()

    async def answer_or_queue(
        self,
        target: Target,
        task_id: UUID,
        inputs: Sequence[Any],
        *,
        no_cache: bool = False,
        idempotency_key: str | None = None,
    ) -> asyncpg.Record | None:
        """Queue the task `task_id` (see `new_task_id`); its record when the memo answered it (None:
        queued for a replica). A memoized answer is recorded as a task too (memo 'hit'). With
        `idempotency_key`, a retry finds the task the first try made (IdempotencyMismatch if
        that one went elsewhere) and adds none."""
        check_storable(inputs)  # ValueError, as for NaN below: nothing is written
        data = json.dumps(inputs, allow_nan=False)
        use_memo = target.memo_salt is not None and not no_cache
        key = memo_key(target.memo_salt, inputs) if use_memo and target.memo_salt else None
        async with self._pool.acquire() as conn:
            if key is not None:
                hit: asyncpg.Record | None = await conn.fetchrow(
                    Q["memo_hit"], task_id, target.tenant, target.steps[0], key, len(inputs), data
                )
                if hit is not None:
                    return hit
            memo = "off" if key is None else "miss"
            queued = await conn.fetchval(
                Q["insert_task"],
                task_id,
                target.tenant,
                target.pipeline,
                list(target.steps),
                len(inputs),
                data,
                memo,
                key,
                target.version,
            )
            if not queued:  # a retry: the task is there already
                existing = await conn.fetchrow(Q["get_task"], task_id, target.tenant)
                if existing is None or (existing["pipeline"], tuple(existing["steps"])) != (
                    target.pipeline,
                    target.steps,
                ):
                    raise IdempotencyMismatch(
                        f"Idempotency-Key {idempotency_key!r} was used for another deployment "
                        "or pipeline"
                    )
                if existing["state"] in ("succeeded", "failed"):
                    return existing
        return None

    async def get(self, tenant: str, task_id: UUID) -> asyncpg.Record | None:
        record: asyncpg.Record | None = await self._pool.fetchrow(Q["get_task"], task_id, tenant)
        return record

    async def cancel(self, tenant: str, task_id: UUID) -> asyncpg.Record | None:
        """The tenant's task, failed as cancelled by its owner; None when it has none such
        unfinished (queries.sql, cancel_task)."""
        record: asyncpg.Record | None = await self._pool.fetchrow(Q["cancel_task"], task_id, tenant)
        return record

    @contextlib.contextmanager
    def expecting(self, task_id: UUID) -> Iterator[asyncio.Future[asyncpg.Record]]:
        """The task's record once it has finished, as a future, for results recorded from the
        moment the block is entered: enter it before the task can finish unseen (before
        queueing it, or before reading its state), so that no result slips in between."""
        future: asyncio.Future[asyncpg.Record] = asyncio.get_running_loop().create_future()
        waiters = self._waiting.setdefault(task_id, set())
        waiters.add(future)
        try:
            yield future
        finally:
            waiters.discard(future)
            if not waiters:
                del self._waiting[task_id]

    async def wait(
        self, finished: asyncio.Future[asyncpg.Record], timeout_s: float
    ) -> asyncpg.Record | None:
        """`finished` (from `expecting`) once delivered; None if not within `timeout_s`, or
        once this process stops."""
        if self._stopping.is_set():
            return None
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(finished)
        except TimeoutError:
            return None
        except asyncio.CancelledError:
            if finished.cancelled() and self._stopping.is_set():
                return None  # stopped: the caller's own task goes on
            raise

    async def run(self) -> None:
        """Hand finished tasks to their waiters, on each wake-up (and poll), until `stop()`."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.listener.run(), name="serving-listener")
            try:
                await self._deliver()
            finally:
                self.listener.stop()

    async def _deliver(self) -> None:
        while not self._stopping.is_set():
            seen = self.listener.seen(RESULTS)
            if self._waiting:
                try:
                    rows = await self._pool.fetch(Q["finished_tasks"], list(self._waiting))
                except DATABASE_ERRORS:
                    rows = []  # the waiters wait on; their deadlines bound them
                    await pause(self._stopping, self.listener.poll_interval)
                for row in rows:
                    for future in self._waiting.get(row["task_id"], ()):
                        if not future.done():
                            future.set_result(row)
            waiting = asyncio.create_task(self.listener.wait_for(RESULTS, seen))
            stopping = asyncio.create_task(self._stopping.wait())
            try:
                await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
                stopping.cancel()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def pause(self, seconds: float) -> bool:
        """Wait `seconds` (a stream's interval), cut short by the shutdown; whether it is on."""
        return await pause(self._stopping, seconds)

    def stop(self) -> None:
        """Stop delivering; the requests still waiting are answered that their task is queued
        (it is: the shutdown loses none)."""
        self._stopping.set()
        for waiters in self._waiting.values():
            for future in waiters:
                if not future.done():
                    future.cancel()
        self.listener.wake()
