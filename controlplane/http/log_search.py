"""`GET /v1/logs/search`: a tenant's log lines, of all its jobs and attempts, that hold a
substring (or match a regular expression, `regex=true`), newest first, a page at a time.

A tenant searches its own jobs' lines only; the admin names the tenant with `?tenant=`. Each
line comes with its job, attempt, learner, stream, seq, id (its place in its job's log) and
time; `next_cursor`, when present, fetches the next page (older lines). The search itself is
`controlplane.logs.search`: its index, its order and its limits are described there and in
migrations/0034_log_search.sql.

With `?follow=true` it is SSE instead: each new matching line, oldest first, as an `event:
line` whose `data` is the same JSON and whose `id` is the line's cursor (send it back as
`Last-Event-ID` to resume exactly after it), from the moment the follow starts; comment
heartbeats while idle. The stream ends only when the server shuts down (resume it then). It
reads the search's own order, polled (one indexed probe per follower per interval), a settle
time behind the clock, so that the lines of several learners and jobs, stored by their agents a
moment after they were printed, arrive in order and none is passed over.

The handler routes and authenticates; what it reads comes from the logs feature's facade
(`controlplane.logs.application`). Writing the lines (JSON, SSE) is this module's.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from aiohttp import web
from pydantic import Field, field_validator

from controlplane.http import params, query
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.errors import refused
from controlplane.http.keys import SSE_HEARTBEAT_S, TASKS
from controlplane.http.operations import Answer, Operation, Param, add_operations, answer
from controlplane.http.requests import MAX_KEY
from controlplane.http.streams import SSE_EVENT, SSE_HEADERS, live_stream
from controlplane.instruments import sse_client
from controlplane.logs.application import FOLLOW_PAGE, LogsApplication
from controlplane.logs.lines import StoredLine
from controlplane.logs.search import (
    DEFAULT_PAGE,
    MAX_PAGE,
    MAX_PATTERN,
    STATEMENT_TIMEOUT_MS,
    LogSearch,
    cursor_of,
)
from controlplane.logs.views import FoundLine, FoundPage
from controlplane.refusals import Refusal

MAX_JOBS = 100
"""The most `job` filters one search takes."""
FOLLOW_SETTLE_S = web.AppKey("log_search_settle_s", float)
"""How long after a line was printed a follower of the search is sent it (see the module)."""
FOLLOW_POLL_S = web.AppKey("log_search_poll_s", float)
SETTLE_S = 2.0
"""An agent ships each learner's lines within its flush interval (0.2 s); its clock and the
database's may differ by a little too."""
POLL_S = 0.5
ACTION = "searches logs"
LOGS_APPLICATION = web.AppKey("logs_application", LogsApplication)
"""The logs' facade, set up with the job logs' feeds (`controlplane.http.logs`)."""

_PATTERN_TEXT = query.text(
    MAX_PATTERN,
    {
        **params.text_schema(min_length=1, max_length=MAX_PATTERN),
        "pattern": "^[^\\u0000\\n\\r]*$",
    },
)


def _pattern(value: Any, name: str) -> str:
    if value is None:
        raise query.refuse(f"{name} is required (what to look for)")
    text: str = _PATTERN_TEXT.check(value, name)
    return text


def _pattern_required(schema: dict[str, Any]) -> None:
    # `pattern` has a default only so that its absence is refused in the words above.
    schema["properties"]["pattern"].pop("default", None)
    schema.setdefault("required", []).append("pattern")


class TenantQuery(query.Query):
    tenant: Annotated[str | None, query.text()] = Field(
        default=None, description="the tenant searched (admin only)"
    )


class SearchQuery(TenantQuery):
    model_config = query.Query.model_config | {"json_schema_extra": _pattern_required}

    pattern: Annotated[str, query.Parameter(_pattern, _PATTERN_TEXT.schema)] = Field(
        default=None,
        validate_default=True,
        description=f"what to look for (1 to {MAX_PATTERN} characters, one line)",
    )
    job: list[Annotated[UUID, query.UUID_PARAMETER]] = Field(
        default=[],
        description=f"only this job's lines (repeatable, at most {MAX_JOBS})",
        json_schema_extra={"maxItems": MAX_JOBS},
    )
    label: list[
        Annotated[str, query.text(MAX_KEY * 2, params.label_filter_schema(MAX_KEY * 2))]
    ] = Field(
        default=[],
        max_length=query.MAX_LABEL_FILTERS,
        description="only jobs with this label, as KEY=VALUE (repeatable: all must hold)",
    )
    cursor: Annotated[str | None, query.CURSOR] = Field(
        default=None, description="the previous page's next_cursor"
    )
    limit: Annotated[int, query.integer(1, MAX_PAGE)] = Field(
        default=DEFAULT_PAGE, description=f"lines per page (default {DEFAULT_PAGE})"
    )
    regex: Annotated[bool, query.BOOLEAN] = Field(
        default=False,
        description="pattern is a regular expression (Postgres's syntax; default false)",
    )
    ignore_case: Annotated[bool, query.BOOLEAN] = Field(
        default=False, description="match regardless of case"
    )
    since: Annotated[datetime | None, query.INSTANT] = Field(
        default=None, description="only lines printed at or after this time (RFC 3339)"
    )
    protocol: Annotated[bool, query.BOOLEAN] = Field(
        default=False,
        description="include the launcher's reports (`@@trainyard/1 {...}`; default false)",
    )
    follow: Annotated[bool, query.BOOLEAN] = Field(
        default=False,
        description="stream new matching lines as SSE, oldest first, from now on (default "
        "false; limit and cursor do not apply)",
    )

    @field_validator("job")
    @classmethod
    def _few(cls, jobs: list[UUID]) -> list[UUID]:
        if len(jobs) > MAX_JOBS:
            raise query.refuse(f"at most {MAX_JOBS} job filters")
        return jobs

    @field_validator("label")
    @classmethod
    def _pairs(cls, labels: list[str]) -> list[str]:
        for label in labels:
            key, sep, _ = label.partition("=")
            if not sep or not key:
                raise query.refuse(f"label filter must be KEY=VALUE, not {label!r}")
        return labels

    def labels(self) -> dict[str, str]:
        return dict(label.partition("=")[::2] for label in self.label)


def add_routes(app: web.Application) -> None:
    app.setdefault(FOLLOW_SETTLE_S, SETTLE_S)
    app.setdefault(FOLLOW_POLL_S, POLL_S)
    add_operations(app, OPERATIONS)


async def search_logs(request: web.Request) -> web.StreamResponse:
    who = principal(request)
    # The tenant first: a tenant's token naming another is refused whatever else it asks.
    tenant = acting_tenant(who, query.parsed(request, TenantQuery).tenant, ACTION)
    asked = query.parsed(request, SearchQuery)
    logs = request.app[LOGS_APPLICATION]
    wanted = logs.search_for(
        tenant,
        asked.pattern,
        regex=asked.regex,
        ignore_case=asked.ignore_case,
        jobs=asked.job,
        labels=asked.labels(),
        since=asked.since,
        protocol=asked.protocol,
    )
    if asked.follow:
        return await _follow(request, logs, wanted, request.headers.get("Last-Event-ID"))
    return answer(await logs.search(wanted, asked.cursor, asked.limit))


def sse_line(stored: StoredLine) -> str:
    data = FoundLine.of(stored).model_dump(mode="json")
    # JSON, not the raw line: a bare "\r" in the text would end an SSE line early.
    return f"id: {cursor_of(stored).encode()}\nevent: line\ndata: {json.dumps(data)}\n\n"


async def _follow(
    request: web.Request, logs: LogsApplication, wanted: LogSearch, last_event_id: str | None
) -> web.StreamResponse:
    app = request.app
    settle_s = app[FOLLOW_SETTLE_S]
    after = await logs.follow_from(last_event_id)
    # The first page before the response is prepared: a bad pattern is still a 400.
    lines = await logs.newer(wanted, after, settle_s=settle_s)
    response = web.StreamResponse(headers=SSE_HEADERS)
    loop = asyncio.get_running_loop()
    # A follow lives until the client leaves: a live stream, counted against the limits.
    with await live_stream(request), sse_client("log_search"):
        await response.prepare(request)
        written = loop.time()
        try:
            while True:
                if lines:
                    await response.write("".join(map(sse_line, lines)).encode())
                    after, written = cursor_of(lines[-1]), loop.time()
                elif loop.time() - written >= app[SSE_HEARTBEAT_S]:
                    await response.write(b": heartbeat\n\n")
                    written = loop.time()
                # The shutdown ends the stream at once: the client resumes with Last-Event-ID.
                if len(lines) < FOLLOW_PAGE and await app[TASKS].pause(app[FOLLOW_POLL_S]):
                    await response.write_eof()
                    return response
                try:
                    lines = await logs.newer(wanted, after, settle_s=settle_s)
                except Refusal as exc:
                    # Past the 200: the stream ends with the reason, and the client may resume.
                    await response.write(f"event: error\ndata: {refused(exc).text}\n\n".encode())
                    return response
        except ConnectionResetError:
            pass  # the client went away: nothing is lost, it resumes with Last-Event-ID
    return response


OPERATIONS = (
    Operation(
        "get",
        "/v1/logs/search",
        search_logs,
        "searchLogs",
        "Search the lines of all the tenant's jobs and attempts",
        {
            200: Answer(
                "a page of matching lines, newest first; with follow=true, SSE: each new line "
                "an `event: line` whose `data` is a line as in the page and whose `id` resumes "
                "after it, comment heartbeats while idle, and `event: error` (data: an Error) "
                "if a later poll fails",
                FoundPage,
                also={"text/event-stream": SSE_EVENT},
            )
        },
        {
            400: "malformed parameter (the field names which): an empty, too long or invalid "
            "pattern, or one whose search ran past the time limit; an admin without tenant",
            401: "missing or wrong token",
            403: "a tenant's token naming another tenant",
            429: "follow=true: the tenant's live streams limit, or the server's, reached; "
            "Retry-After",
        },
        description="Lines that hold `pattern` (a substring; a Postgres regular expression "
        "with `regex=true`), newest first by the time printed, of every job and attempt of the "
        "caller's tenant (an admin names it with `tenant`); the launcher's protocol lines only "
        "with `protocol=true`. `next_cursor`, when not null, fetches the next (older) page; "
        "pages never repeat or skip a line, while lines keep arriving. Each search statement "
        f"may run {STATEMENT_TIMEOUT_MS} ms.",
        query=SearchQuery,
        params=(
            Param(
                "Last-Event-ID",
                "header",
                "follow=true: resume after this line (its SSE id)",
                {"type": "string"},
            ),
        ),
    ),
)
