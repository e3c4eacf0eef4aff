"""Running projections: follow the global log, apply each event and advance the checkpoint in
one transaction, so every projection is exactly-once, resumable and rebuildable from zero."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import asyncpg

from controlplane.database import CONNECTION_ERRORS, Executor
from controlplane.events.records import ORIGIN, LogBatch, LogPosition, RecordedEvent
from controlplane.events.store import EventStore
from controlplane.events.subscription import HeldBack, LogListener
from controlplane.instruments import PROJECTIONS_STOPPED
from controlplane.projections.base import Projection
from controlplane.queries import Q

log = logging.getLogger(__name__)

APPLY_WAIT_S = 10.0
MAX_FAILURES = 5
"""How many times in a row a projection may fail on the same event before it stops."""


class BatchFailed(Exception):
    """A projection raised on a batch of events (not a lost connection: that is retried as is);
    the batch rolled back and its checkpoint did not move."""

    def __init__(self, projection: str, events: Sequence[RecordedEvent]) -> None:
        first, last = events[0], events[-1]
        where = (
            f"the event at position {first.position} ({first.event.type_name}, stream "
            f"{first.stream_id} version {first.stream_version})"
            if len(events) == 1
            else f"the events at positions {first.position} to {last.position}"
        )
        super().__init__(f"projection {projection} failed on {where}")
        self.events = events


@dataclass(frozen=True, slots=True)
class _Strikes:
    """The failures in a row of one projection on the event at `position`."""

    position: int
    count: int


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
        max_failures: int = MAX_FAILURES,
    ) -> None:
        self._pool = pool
        self._store = store
        self._listener = listener
        self.projections = {p.name: p for p in projections}
        self._batch_size = batch_size
        if max_failures < 1:
            raise ValueError(f"max_failures must be 1 or more, not {max_failures}")
        self._max_failures = max_failures
        self._stopping = asyncio.Event()
        self._one_by_one: dict[str, int] = {}
        """Projections that failed on a batch of several events: applied one event at a time
        through the position of that batch's last, to find the event that fails."""
        self._strikes: dict[str, _Strikes] = {}
        self._stopped: dict[str, str] = {}
        self._held_back = HeldBack()
        """How soon to look again at news an older transaction holds back: it may append
        nothing, and then its end wakes no one (a claim waited up to the poll interval for its
        job's queue row so, 0.85 s in `bench search`)."""

    async def run(self) -> None:
        """Catch every projection up, then wait for news; until `stop()`. A projection that
        fails MAX_FAILURES times in a row on the same event stops (see `stopped`)."""
        while not self._stopping.is_set():
            # No pause between rounds: what came during a round is the next one's batch (a
            # job's row written once for several of its events), and a pause of 10 ms made a
            # search's next trial wait for its queue row 10 ms longer (`bench search`).
            seen = self._listener.generation
            active = [name for name in self.projections if name not in self._stopped]
            # Every projection in one transaction that reads the log once: apart, each paid a
            # transaction of its own (six round trips) and decoded the same events again, and
            # a round's look at which of them the news concerned cost more than taking part
            # (its lock and checkpoint are a row each in statements the round makes anyway).
            # One that fails (or was failing) goes alone, holding none of the others back.
            together = [
                name for name in active if name not in self._one_by_one | self._strikes.keys()
            ]
            alone = [name for name in active if name not in together]
            more = held_back = False
            if together:
                try:
                    _, more, held_back = await self._step(together)
                except Exception as error:
                    log.info("projections failed together (%r); each goes alone", error)
                    alone = active
            for name in alone:
                try:
                    await self.catch_up(self.projections[name])
                except BatchFailed as failed:
                    self._failed(name, failed)
                except Exception:
                    # A lost connection (or an event this code cannot decode): the batch rolled
                    # back and its checkpoint did not move, so retrying after the poll interval
                    # is safe; the other projections go on meanwhile.
                    log.exception("projection %s: a batch failed; retrying", name)
                else:
                    self._strikes.pop(name, None)
            if not more:
                await self._listener.wait(seen, self._held_back.within(held_back))

    async def _news(self, after: LogPosition) -> Mapping[str, LogPosition] | None:
        """The categories of the events readable after `after`, each with its last event's
        place; None when there are more than a batch of them."""
        rows = await self._pool.fetch(
            Q["log_news"], str(after.xid), after.position, self._batch_size + 1
        )
        if rows and rows[0]["read"] > self._batch_size:
            return None
        return {row["category"]: LogPosition(row["xid"], row["position"]) for row in rows}

    def stopped(self) -> dict[str, str]:
        """The projections this runner stopped, and why: each failed on one event too often."""
        return dict(self._stopped)

    def _failed(self, name: str, failed: BatchFailed) -> None:
        events = failed.events
        if len(events) > 1:
            # Which of them fails is not known yet: go one event at a time through them.
            self._one_by_one[name] = events[-1].position
            log.warning("%s; retrying one event at a time", failed, exc_info=failed.__cause__)
            return
        position = events[0].position
        previous = self._strikes.get(name)
        count = previous.count + 1 if previous and previous.position == position else 1
        self._strikes[name] = _Strikes(position, count)
        if count < self._max_failures:
            log.warning(
                "%s (%d of %d); retrying",
                failed,
                count,
                self._max_failures,
                exc_info=failed.__cause__,
            )
            return
        self._stopped[name] = f"{failed} {count} times in a row: {failed.__cause__!r}"
        PROJECTIONS_STOPPED.add(1, {"projection": name})
        log.error(
            "%s %d times in a row; projection %s stopped until the code is fixed and the "
            "control plane restarted",
            failed,
            count,
            name,
            exc_info=failed.__cause__,
        )

    def stop(self) -> None:
        self._stopping.set()

    async def catch_up(self, projection: Projection) -> int:
        """Apply batches until nothing is left to read now; returns how many events it applied."""
        total = 0
        while True:
            applied, full, _ = await self._step([projection.name])
            total += applied
            if not full:
                return total

    async def _step(self, names: Sequence[str]) -> tuple[int, bool, bool]:
        """Apply one batch of the log to the named projections in one transaction (those that
        another runner holds sit it out): how many events it read, whether it was full (more
        may be waiting) and whether news after it is held back (`LogBatch.held_back`);
        (0, False, False) when another runner holds them all."""
        async with self._pool.acquire() as conn, conn.transaction():
            held = [row["name"] for row in await conn.fetch(Q["lock_projections"], names)]
            if not held:
                return 0, False, False
            # Read under the locks: no checkpoint can move until this transaction ends. The
            # read comes before any write, so it is not bounded by this transaction's own xid;
            # from its first write on, the batch holds back every reader of the log until it
            # commits, which is why batches are kept small.
            places = {name: ORIGIN for name in names if name in held}  # in the runner's order
            for row in await conn.fetch(Q["read_checkpoints"], held):
                places[row["name"]] = LogPosition(row["xid"], row["position"])
            limit = self._batch_size
            through = self._one_by_one.get(held[0]) if len(held) == 1 else None
            if through is not None:
                if places[held[0]].position < through:
                    limit = 1
                else:
                    del self._one_by_one[held[0]]
            batch = await self._apply_batch(conn, places, limit)
        return batch.read, batch.read == limit, batch.held_back

    async def _apply_batch(
        self, conn: Executor, places: Mapping[str, LogPosition], limit: int
    ) -> LogBatch:
        """Read the batch of at most `limit` after the oldest of `places` once, apply to each
        projection its events after its own place, and advance the checkpoints, on `conn`;
        BatchFailed when a projection raises on its events."""
        chosen = [self.projections[name].categories for name in places]
        wanted = None if None in chosen else frozenset().union(*filter(None, chosen))
        start = min(places.values())
        batch = await self._store.read_log_of(wanted, start, limit, conn=conn)
        for name, place in places.items():
            projection = self.projections[name]
            events = [
                event
                for event in batch.events
                if event.log_position > place
                and (projection.categories is None or event.category in projection.categories)
            ]
            if events:
                try:
                    await projection.apply(conn, events)
                except CONNECTION_ERRORS:
                    raise
                except Exception as exc:
                    raise BatchFailed(name, events) from exc
        # A place ahead of where this batch ended (a full batch read from an older one) stays.
        moved = [name for name, place in places.items() if batch.end > place]
        if moved:
            end = batch.end
            await conn.execute(Q["write_checkpoints"], moved, str(end.xid), end.position)
        return batch

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
        """Whether the projection has applied every event of its categories readable now (its
        checkpoint may not have moved past the others' yet: see IDLE_S)."""
        async with self._pool.acquire() as conn:
            checkpoint = await _checkpoint(conn, name)
        news = await self._news(checkpoint)
        categories = self.projections[name].categories
        return news is not None and not (news if categories is None else news.keys() & categories)

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
            await conn.execute(Q["write_checkpoints"], [name], str(ORIGIN.xid), ORIGIN.position)
            while (
                batch := await self._apply_batch(
                    conn, {name: await _checkpoint(conn, name)}, self._batch_size
                )
            ).read:
                total += batch.read
        return total


async def _checkpoint(conn: Executor, name: str) -> LogPosition:
    row = await conn.fetchrow(Q["read_checkpoints"], [name])
    return LogPosition(row["xid"], row["position"]) if row else ORIGIN
