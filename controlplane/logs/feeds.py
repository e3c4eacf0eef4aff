"""One shared reader per followed job's log, that the job's followers subscribe to.

Each SSE follower of a job's log used to poll Postgres every poll interval and re-read the job's
history on each of its events: N followers, N probes per interval and N history reads per event,
on a pool of a few connections. A feed does that once for all of them: one probe per interval
per followed job, one read of the job's state per job event; it starts with the first follower
and stops with the last.

A feed holds no history: a follower reads what came before it joined from the database itself,
after subscribing (so that nothing falls between), and leaves out what it then gets twice. Each
follower's queue is bounded; one that falls behind (a slow client) is not waited for and costs
no memory: its queue is emptied, it is told it LAGGED, and it catches up from the database on its
own, from its cursor, before taking from the feed again.

A feed that starts with its first follower brings the lines after the log's head as it reads
it, and that read races the follower's own catch-up: lines that commit between the two would
fall between them (every follower of a restarted server is the first of its feed). So the
followers that joined before the head was read are told they LAGGED once it is: they read the
database again, up to past it.

Ids commit in increasing order per job (see `controlplane.logs.store`), so a feed that reads
after its last id never skips a line, and every line at or below it has committed: a follower
that catches up after subscribing reads all that its queue will not bring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, TypeVar
from uuid import UUID

import asyncpg

from controlplane.database import DATABASE_ERRORS
from controlplane.events.hub import StreamHub
from controlplane.invariants import InvariantBroken
from controlplane.jobs.lifecycle import JOB, JobStatus, replay
from controlplane.jobs.service import Jobs
from controlplane.jobs.streams import job_stream
from controlplane.logs.lines import StoredLine
from controlplane.logs.store import last_id, quiet_s, read_lines

log = logging.getLogger(__name__)
T = TypeVar("T")

PAGE = 1000
FOLLOWER_LINES = 10_000
"""The most lines a follower's queue holds; past them it catches up from the database."""


@dataclass(frozen=True, slots=True)
class Lines:
    """The job's lines stored after the previous `Lines`' `upto`, up to `upto`, in id order."""

    lines: list[StoredLine]
    upto: int


@dataclass(frozen=True, slots=True)
class End:
    """The job and its learners have ended, every line up to `upto` was sent, and the log has
    been quiet for the settle time: the log is complete."""

    state: JobStatus
    upto: int


class Lagged:
    """Read from the database again, from the follower's cursor: it fell behind and its queue
    was emptied, or it joined before its feed knew where to start."""


LAGGED: Final = Lagged()
Item = Lines | End | Lagged | None
"""What a follower gets next; None when the server is shutting down."""


class Follower:
    def __init__(self, feed: Feed, capacity: int) -> None:
        self._feed = feed
        self._capacity = capacity
        self._items: deque[Lines | End | None] = deque()
        self._lines = 0
        self._lagged = False
        self._ready = asyncio.Event()

    def put(self, item: Lines | End | None) -> None:
        if self._lagged:
            return  # it reads from the database, up to past this, before it takes again
        if isinstance(item, Lines):
            if self._lines + len(item.lines) > self._capacity:
                self.lag()
                return
            self._lines += len(item.lines)
        self._items.append(item)
        self._ready.set()

    def lag(self) -> None:
        """Empty the queue: the follower reads from the database before it takes again."""
        self._items.clear()
        self._lines = 0
        self._lagged = True
        self._ready.set()

    async def next(self) -> Item:
        """The next item, waiting for one (cancel the wait, with a timeout, to do other work)."""
        await self._ready.wait()
        if self._lagged:
            self._lagged = False
            # What ended the feed while the queue was refused must still arrive, after the
            # catch-up.
            if self._feed.ended:
                self._items.append(self._feed.last)
            else:
                self._ready.clear()
            return LAGGED
        item = self._items.popleft()
        if isinstance(item, Lines):
            self._lines -= len(item.lines)
        if not self._items:
            self._ready.clear()
        return item


@dataclass(eq=False)
class Feed:
    job_id: UUID
    followers: set[Follower] = field(default_factory=set)
    ended: bool = False
    last: End | None = None
    """How the feed ended (once `ended`): End, or None when the server is shutting down."""
    task: asyncio.Task[None] | None = None
    """The task that reads the job's lines, set once the feed is started."""

    def started(self) -> asyncio.Task[None]:
        """The feed's task (InvariantBroken before it is started)."""
        if self.task is None:
            raise InvariantBroken(f"the log feed of job {self.job_id} has no task")
        return self.task

    def publish(self, item: Lines | End | None) -> None:
        if item is None or isinstance(item, End):
            self.ended, self.last = True, item
        for follower in self.followers:
            follower.put(item)


class LogFeeds:
    """The feeds of the jobs being followed (one per job)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        hub: StreamHub,
        jobs: Jobs,
        *,
        poll_s: float,
        settle_s: float,
        capacity: int = FOLLOWER_LINES,
    ) -> None:
        self._pool = pool
        self._hub = hub
        self._jobs = jobs
        self._poll_s = poll_s
        self._settle_s = settle_s
        self._capacity = capacity
        self._feeds: dict[UUID, Feed] = {}

    @property
    def feeds(self) -> int:
        """How many jobs are being followed now (each read once, whatever its followers)."""
        return len(self._feeds)

    @property
    def followers(self) -> int:
        """How many streams follow a job's log now, over all feeds."""
        return sum(len(feed.followers) for feed in self._feeds.values())

    @contextlib.contextmanager
    def follow(self, job_id: UUID) -> Iterator[Follower]:
        """Follow the job's log from now on (read what came before from the database, after
        subscribing); the feed stops when its last follower leaves."""
        feed = self._feeds.get(job_id)
        if feed is None:
            feed = self._feeds[job_id] = Feed(job_id)
            feed.task = asyncio.create_task(self._run(feed), name=f"log-feed-{job_id}")
        follower = Follower(feed, self._capacity)
        if feed.ended:
            follower.put(feed.last)
        feed.followers.add(follower)
        try:
            yield follower
        finally:
            feed.followers.discard(follower)
            if not feed.followers:
                del self._feeds[job_id]
                feed.started().cancel()

    async def close(self) -> None:
        """Stop every feed (their followers get None)."""
        feeds = list(self._feeds.values())
        for feed in feeds:
            feed.started().cancel()
        await asyncio.gather(*(f.task for f in feeds if f.task), return_exceptions=True)
        for feed in feeds:
            if not feed.ended:
                feed.publish(None)

    async def _run(self, feed: Feed) -> None:
        try:
            await self._read(feed)
        finally:
            # Ended, failed or stopped: no follower waits for ever.
            if not feed.ended:
                feed.publish(None)

    async def _read(self, feed: Feed) -> None:
        job_id = feed.job_id
        # Subscribed before the job's state and the log's head are read, so that no change in
        # between is missed.
        with self._hub.subscribe(job_stream(job_id)) as changes:
            ended_at, state = await self._retry(lambda: job_end(self._jobs, job_id))
            position = await self._retry(lambda: last_id(self._pool, job_id))
            # Its followers so far may have caught up short of `position` (the lines that
            # committed since their read): they read again. Later ones read after this.
            for follower in feed.followers:
                follower.lag()
            while True:
                try:
                    # How long the log has been quiet (None while the job runs or a learner is
                    # still allocated), asked BEFORE reading the lines: every batch that counted
                    # towards it has then been read, so the log never ends short of one.
                    quiet = None
                    if ended_at is not None:
                        quiet = await quiet_s(self._pool, job_id, ended_at)
                    page = await read_lines(self._pool, job_id, after=position, limit=PAGE)
                except DATABASE_ERRORS as exc:
                    log.warning("log feed of job %s: %s; retrying", job_id, exc)
                    await asyncio.sleep(self._poll_s)
                    continue
                if page:
                    position = page[-1].id
                    feed.publish(Lines(page, position))
                    if len(page) == PAGE:
                        continue
                if quiet is not None and quiet >= self._settle_s:
                    feed.publish(End(state, position))
                    return
                try:
                    async with asyncio.timeout(self._poll_s):
                        change = await changes.next()
                except TimeoutError:
                    continue  # time to look for lines again
                if change is None:
                    return  # the server is shutting down; followers resume elsewhere
                # A job event (or LAGGED: some were missed): read the job's state again.
                ended_at, state = await self._retry(lambda: job_end(self._jobs, job_id))

    async def _retry(self, read: Callable[[], Awaitable[T]]) -> T:
        while True:
            try:
                return await read()
            except DATABASE_ERRORS as exc:
                log.warning("log feed: %s; retrying", exc)
                await asyncio.sleep(self._poll_s)


async def job_end(jobs: Jobs, job_id: UUID) -> tuple[datetime | None, JobStatus]:
    """When (by the database's clock) the job ended, None while it runs; and its state."""
    history = await jobs.history(job_id)
    job = replay(JOB.typed(history))
    if job is None:  # followers follow jobs that exist
        raise InvariantBroken(f"job {job_id} is followed but has no events")
    # A terminal state is final: its event is the stream's last.
    return (history[-1].recorded_at if job.state.terminal else None), job.state
