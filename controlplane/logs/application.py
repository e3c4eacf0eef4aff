"""Learners' logs as their readers use them: a job's lines, read or followed, and a tenant's
lines searched, a page at a time or followed.

A facade in the sense of eventsourcing's Application (see `controlplane.jobs.application`): it
takes requests already parsed and authorized (the front end has found the job visible to the
caller, or the tenant it acts for), reads through the logs' store, feeds and search, and answers
with the lines its readers are shown; what it refuses it raises as a `Refusal`. How the lines
are written to the client (text, JSON, SSE) is the front end's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from controlplane.logs.feeds import Follower, LogFeeds
from controlplane.logs.lines import StoredLine, Stream
from controlplane.logs.search import (
    Cursor,
    LogSearch,
    PatternError,
    SearchTimeout,
    cursor_of,
    follow_start,
    newer,
    search,
)
from controlplane.logs.store import read_lines
from controlplane.logs.views import FoundLine, FoundPage
from controlplane.refusals import Refusal, Refused
from runners import protocol

PAGE = 1000
"""The most lines of a job's log read at once."""
FOLLOW_PAGE = 500
"""The most lines a search's follower is sent at once."""


@dataclass(frozen=True, slots=True)
class Shown:
    """Which of a job's lines a reader is shown."""

    attempt: int | None = None
    learner: int | None = None
    protocol: bool = False
    """Whether the launcher's protocol lines are included."""

    def matches(self, stored: StoredLine) -> bool:
        line = stored.line
        return (self.attempt is None or line.attempt == self.attempt) and (
            self.learner is None or line.learner == self.learner
        )

    def shows(self, stored: StoredLine) -> bool:
        return self.matches(stored) and (self.protocol or not is_report(stored))


def is_report(stored: StoredLine) -> bool:
    """Whether the line is one of the launcher's reports to the agent, not the user's output."""
    line = stored.line
    return (
        line.stream is Stream.STDOUT
        and line.text.startswith(protocol.PREFIX)
        and protocol.parse(line.text) is not None
    )


@dataclass(frozen=True, slots=True)
class LogPage:
    """What one read of a job's log found: the lines shown, where the read ended (the last
    line read, shown or not: the next read starts after it), and whether it reached the end."""

    lines: list[StoredLine]
    last_id: int | None
    complete: bool


class LogsApplication:
    def __init__(self, pool: asyncpg.Pool, feeds: LogFeeds) -> None:
        self._pool = pool
        self._feeds = feeds

    async def page(self, job_id: UUID, shown: Shown, after: int) -> LogPage:
        """The job's lines after `after`, in the order stored, up to PAGE read."""
        read = await read_lines(
            self._pool,
            job_id,
            attempt=shown.attempt,
            learner=shown.learner,
            after=after,
            limit=PAGE,
        )
        return LogPage(
            lines=[s for s in read if shown.protocol or not is_report(s)],
            last_id=read[-1].id if read else None,
            complete=len(read) < PAGE,
        )

    def follow(self, job_id: UUID) -> AbstractContextManager[Follower]:
        """The job's lines from now on, and its end (subscribe before reading what is
        stored, so that nothing falls between)."""
        return self._feeds.follow(job_id)

    @staticmethod
    def search_for(
        tenant: str,
        pattern: str,
        *,
        regex: bool,
        ignore_case: bool,
        jobs: Sequence[UUID],
        labels: Mapping[str, str],
        since: datetime | None,
        protocol: bool,
    ) -> LogSearch:
        """The search a request asks for; a pattern that cannot be searched for is refused."""
        try:
            return LogSearch(
                tenant=tenant,
                pattern=pattern,
                regex=regex,
                ignore_case=ignore_case,
                jobs=jobs or None,
                labels=labels or None,
                since=since,
                protocol=protocol,
            )
        except PatternError as exc:
            raise _bad_pattern(exc) from None

    async def search(self, wanted: LogSearch, cursor: str | None, limit: int) -> FoundPage:
        """A page of the lines found, newest first, below `cursor` (a page's next_cursor)."""
        after = _cursor(cursor, "cursor") if cursor is not None else None
        try:
            # One more than the page: whether there is a next page, without a count.
            found = await search(self._pool, wanted, after=after, limit=limit + 1)
        except (PatternError, SearchTimeout) as exc:
            raise _bad_pattern(exc) from None
        page = found[:limit]
        return FoundPage(
            lines=[FoundLine.of(s) for s in page],
            next_cursor=cursor_of(page[-1]).encode() if len(found) > limit else None,
        )

    async def follow_from(self, last_event_id: str | None) -> Cursor:
        """Where a follower of a search starts: after its Last-Event-ID, or now."""
        if last_event_id is not None:
            return _cursor(last_event_id, "Last-Event-ID")
        return await follow_start(self._pool)

    async def newer(self, wanted: LogSearch, after: Cursor, *, settle_s: float) -> list[StoredLine]:
        """The lines found above `after`, oldest first, printed at least `settle_s` ago."""
        try:
            return await newer(self._pool, wanted, after, settle_s=settle_s, limit=FOLLOW_PAGE)
        except (PatternError, SearchTimeout) as exc:
            raise _bad_pattern(exc) from None


def _cursor(text: str, field: str) -> Cursor:
    try:
        return Cursor.decode(text)
    except ValueError:
        raise Refusal(Refused.MALFORMED, f"invalid {field}", field=field) from None


def _bad_pattern(exc: Exception) -> Refusal:
    return Refusal(Refused.MALFORMED, str(exc), field="pattern")
