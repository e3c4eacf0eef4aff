"""Search across a tenant's logs: the lines of all its jobs and attempts that hold a substring or
match a regular expression, newest first, a page at a time.

Both kinds of pattern become one Postgres regular expression (a substring with its punctuation
escaped), so that one statement, one index (pg_trgm's GIN serves `~` and `~*`) and one set of
errors serve both. The order is (at, job_id, id) descending: `at` is when the learner printed
the line, and (job_id, id) makes it total, so a cursor of those three resumes exactly below the
last line of a page. Lines stored after the first page was read either sort above the cursor
(never shown by later pages) or below it (shown once, where they belong): pages never repeat a
line and never skip one that was there when the search began.

A pattern is the user's: at most MAX_PATTERN characters, compiled by Postgres before the search
(a malformed one is a PatternError), and each statement runs under STATEMENT_TIMEOUT_MS, so a
pathological one costs the database that long at most (SearchTimeout).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final
from uuid import UUID

import asyncpg

from controlplane.logs.lines import LogLine, StoredLine, Stream
from controlplane.queries import Q

MAX_PATTERN: Final = 500
"""The longest pattern, in characters: longer ones only cost the regex compiler more."""
STATEMENT_TIMEOUT_MS: Final = 3000
"""How long one search statement may run before Postgres cancels it."""
MAX_PAGE: Final = 1000
DEFAULT_PAGE: Final = 100

_PUNCTUATION = re.compile(r"[^0-9A-Za-z\u0080-\U0010ffff]")
"""What a substring's escaping prefixes with a backslash: in Postgres's regular expressions a
backslash before any character but an ASCII letter or digit makes it literal."""
_ABSOLUTE_ANCHOR = re.compile(r"(?<!\\)(?:\\\\)*\\[AZ]")


class PatternError(ValueError):
    """The pattern cannot be searched for; the message says why."""


class SearchTimeout(Exception):
    """The search ran past STATEMENT_TIMEOUT_MS and was cancelled."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """The last line of a page: the next page starts below it."""

    at: datetime
    job_id: UUID
    id: int

    def encode(self) -> str:
        raw = json.dumps([self.at.isoformat(), str(self.job_id), self.id])
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """What `encode` wrote; ValueError for anything else (a cursor is not made up)."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            at, job_id, line_id = json.loads(raw)
            when = datetime.fromisoformat(at)
            if when.tzinfo is None or type(line_id) is not int or not 0 <= line_id < 2**63:
                raise ValueError(text)
            return cls(when.astimezone(UTC), UUID(job_id), line_id)
        except (ValueError, TypeError, OverflowError):
            raise ValueError(f"not a cursor: {text!r}") from None


@dataclass(frozen=True, slots=True)
class LogSearch:
    """What to look for, and where."""

    tenant: str
    pattern: str
    regex: bool = False
    """A regular expression (Postgres's syntax), rather than a plain substring."""
    ignore_case: bool = False
    jobs: Sequence[UUID] | None = None
    """Only these jobs' lines (None: all the tenant's)."""
    labels: Mapping[str, str] | None = None
    """Only the lines of jobs whose labels hold all of these."""
    since: datetime | None = None
    """Only lines printed at or after this time."""
    protocol: bool = False
    """Include the launcher's reports to the agent (`@@trainyard/1 {...}`)."""

    def __post_init__(self) -> None:
        if not self.pattern:
            raise PatternError("the pattern must not be empty")
        if len(self.pattern) > MAX_PATTERN:
            raise PatternError(
                f"the pattern has {len(self.pattern)} characters; at most {MAX_PATTERN}"
            )
        if "\n" in self.pattern or "\r" in self.pattern:
            raise PatternError("a line holds no line break: the pattern must not either")
        if self.regex and _ABSOLUTE_ANCHOR.search(self.pattern):
            raise PatternError("\\A and \\Z are not supported: anchor with ^ and $")

    @property
    def expression(self) -> str:
        """The Postgres regular expression the lines must match."""
        if self.regex:
            return self.pattern
        return _PUNCTUATION.sub(lambda m: "\\" + m.group(), self.pattern)


async def search(
    pool: asyncpg.Pool, query: LogSearch, *, after: Cursor | None = None, limit: int = DEFAULT_PAGE
) -> list[StoredLine]:
    """Up to `limit` of the tenant's lines that match, newest first, below `after`.

    PatternError for a regular expression Postgres refuses; SearchTimeout when a statement runs
    past STATEMENT_TIMEOUT_MS.
    """
    cursor = (after.at, after.job_id, after.id) if after else (None, None, None)
    return await _matching(pool, query, "search_job_logs", *cursor, limit)


async def newer(
    pool: asyncpg.Pool, query: LogSearch, after: Cursor, *, settle_s: float, limit: int
) -> list[StoredLine]:
    """Up to `limit` of the tenant's matching lines above `after` in the search's order, oldest
    first, printed at least `settle_s` ago: what a follower of the search gets next."""
    return await _matching(
        pool, query, "follow_job_logs", after.at, after.job_id, after.id, limit, settle_s
    )


async def follow_start(pool: asyncpg.Pool) -> Cursor:
    """The cursor of a follow that starts now: it gets the lines printed from now on."""
    at: datetime = await pool.fetchval(Q["log_follow_start"])
    return Cursor(at, UUID(int=0), 0)


async def _matching(
    pool: asyncpg.Pool,
    query: LogSearch,
    statement: str,
    at: datetime | None,
    job_id: UUID | None,
    line_id: int | None,
    limit: int,
    *more: object,
) -> list[StoredLine]:
    labels = json.dumps(dict(query.labels)) if query.labels else None
    async with pool.acquire() as conn, conn.transaction(readonly=True):
        # Local to the transaction: the pool's connection goes back as it came. Each call is
        # planned for its own pattern (see the statements).
        await conn.execute(
            f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS};"
            "SET LOCAL plan_cache_mode = force_custom_plan"
        )
        try:
            await conn.fetchval(Q["check_log_pattern"], query.expression)
            rows = await conn.fetch(
                Q[statement],
                query.tenant,
                query.expression,
                query.ignore_case,
                at,
                job_id,
                line_id,
                list(query.jobs) if query.jobs is not None else None,
                labels,
                query.since,
                limit,
                query.protocol,
                *more,
            )
        except asyncpg.InvalidRegularExpressionError as exc:
            raise PatternError(f"not a regular expression Postgres accepts: {exc}") from None
        except asyncpg.QueryCanceledError:
            raise SearchTimeout(
                f"the search ran longer than {STATEMENT_TIMEOUT_MS / 1000:g} s: use a longer "
                "or more specific pattern, or narrow it with job, label or since"
            ) from None
    return [
        StoredLine(
            id=r["id"],
            line=LogLine(
                job_id=r["job_id"],
                attempt=r["attempt"],
                learner=r["learner"],
                stream=Stream(r["stream"]),
                seq=r["seq"],
                at=r["at"],
                text=r["line"],
            ),
        )
        for r in rows
    ]


def cursor_of(stored: StoredLine) -> Cursor:
    """The cursor just below `stored`: the next page starts after it."""
    return Cursor(stored.line.at, stored.line.job_id, stored.id)
