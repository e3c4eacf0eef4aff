"""Running projections: follow the global log, apply each event and advance the checkpoint in
one transaction, so every projection is exactly-once, resumable and rebuildable from zero."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import asyncpg

from controlplane.database import Executor
from controlplane.events.records import ORIGIN, LogPosition
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.projections.base import Projection
from controlplane.queries import Q

log = logging.getLogger(__name__)

APPLY_WAIT_S = 10.0
ROUND_S = 0.01
"""After a round that applied events, the least wait before the next one: under a stream of
events a round then takes what came meanwhile as one batch (a job's row written once for
several of its events, a round's fixed statements shared), for at most this much more delay
on the read models; after a quiet spell an event is applied at once."""


class ProjectionRunner:
    """Keeps projections caught up with the log; several replicas may run one each safely."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        store: EventStore,
        listener: LogListener,
        projections: Sequence[Projection],
        *,
        batch_size: int = 500,
    ) -> None:
        self._pool = pool
        self._store = store
        self._listener = listener
        self.projections = {p.name: p for p in projections}
        self._batch_size = batch_size
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        """Catch every projection up, then wait for news; until `stop()`."""
        while not self._stopping.is_set():
            seen = self._listener.generation
            applied = 0
            for projection in self.projections.values():
                try:
                    applied += await self.catch_up(projection)
                except Exception:
                    # A lost connection or a failing projection: its batch rolled back and its
                    # checkpoint did not move, so retrying after the poll interval is safe; the
                    # other projections go on meanwhile.
                    log.exception("projection %s: a batch failed; retrying", projection.name)
            if applied:
                await asyncio.sleep(ROUND_S)
            await self._listener.wait(seen)

    def stop(self) -> None:
        self._stopping.set()

    async def catch_up(self, projection: Projection) -> int:
        """Apply batches until nothing is left to read now; returns how many events it applied."""
        total = 0
        while True:
            applied = await self.step(projection)
            total += max(applied, 0)
            if applied < self._batch_size:
                return total

    async def step(self, projection: Projection) -> int:
        """Apply one batch in one transaction; -1 when another runner holds the projection."""
        async with self._pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(Q["lock_projection"], projection.name):
                return -1
            # Read under the lock: the checkpoint cannot move until this transaction ends.
            # The read comes before any write, so it is not bounded by this transaction's own
            # xid; from its first write on, the batch holds back every reader of the log
            # until it commits, which is why batches are kept small.
            return await self._apply_batch(
                conn, projection, await _checkpoint(conn, projection.name)
            )

    async def _apply_batch(
        self, conn: Executor, projection: Projection, position: LogPosition
    ) -> int:
        """Apply the batch after `position` and advance the checkpoint, on `conn`."""
        batch = await self._store.read_log_of(
            projection.categories, position, self._batch_size, conn=conn
        )
        if batch.events:
            await projection.apply(conn, batch.events)
        if batch.read:
            end = batch.end
            await conn.execute(Q["write_checkpoint"], projection.name, str(end.xid), end.position)
        return batch.read

    async def wait_applied(self, name: str, target: LogPosition) -> None:
        """Return once the projection has applied the log through `target` (applying it here
        when no other runner holds it); TimeoutError after APPLY_WAIT_S.

        Polled rather than notified: the runner holding the projection may be another process,
        and `target` becomes readable only when every older transaction has ended.
        """
        projection = self.projections[name]
        async with asyncio.timeout(APPLY_WAIT_S):
            while True:
                await self.catch_up(projection)
                async with self._pool.acquire() as conn:
                    if await _checkpoint(conn, name) >= target:
                        return
                await asyncio.sleep(0.01)

    async def is_caught_up(self, name: str) -> bool:
        """Whether the projection has applied every event readable now."""
        async with self._pool.acquire() as conn:
            return not await self._store.has_more(await _checkpoint(conn, name), conn=conn)

    async def caught_up(self) -> bool:
        """Whether every projection has caught up."""
        for name in self.projections:
            if not await self.is_caught_up(name):
                return False
        return True

    async def rebuild(self, name: str) -> int:
        """Empty a projection's tables and replay the log from zero; returns the events applied.

        One transaction: readers (token checks, job lists) see the old tables until the new
        ones commit, never an empty or half-built projection. Rows are deleted, not truncated,
        because TRUNCATE would lock readers out for the whole replay.

        A projection that owns no tables (an outbox, whose rows are side effects to carry out,
        not a view to rebuild) is refused with ValueError: replaying it would redo them.
        """
        projection = self.projections[name]
        if not projection.tables:
            raise ValueError(
                f"projection {name} owns no tables to rebuild (it is an outbox: replaying the "
                "log into it would send old notifications again)"
            )
        total = 0
        async with self._pool.acquire() as conn, conn.transaction():
            # Wait for a running batch (here or in another replica) instead of skipping.
            await conn.execute(Q["lock_projection_wait"], name)
            for table in projection.tables:
                # Table names come from the projection's code, never from input.
                await conn.execute(f'DELETE FROM "{table}"')
            await conn.execute(Q["write_checkpoint"], name, str(ORIGIN.xid), ORIGIN.position)
            while applied := await self._apply_batch(
                conn, projection, await _checkpoint(conn, name)
            ):
                total += applied
        return total


async def _checkpoint(conn: Executor, name: str) -> LogPosition:
    row = await conn.fetchrow(Q["read_checkpoint"], name)
    return LogPosition(row["xid"], row["position"]) if row else ORIGIN
