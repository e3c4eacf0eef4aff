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
heartbeats while idle. The stream never ends by itself. It reads the search's own order, polled
(one indexed probe per follower per interval), a settle time behind the clock, so that the
lines of several learners and jobs, stored by their agents a moment after they were printed,
arrive in order and none is passed over.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from controlplane.http import params
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.errors import error
from controlplane.http.keys import POOL, SSE_HEARTBEAT_S
from controlplane.http.requests import MAX_KEY
from controlplane.http.streams import SSE_EVENT, SSE_HEADERS, live_stream
from controlplane.instruments import sse_client
from controlplane.logs.lines import StoredLine
from controlplane.logs.search import (
    DEFAULT_PAGE,
    MAX_PAGE,
    MAX_PATTERN,
    STATEMENT_TIMEOUT_MS,
    Cursor,
    LogSearch,
    PatternError,
    SearchTimeout,
    cursor_of,
    follow_start,
    newer,
    search,
)

MAX_JOBS = 100
"""The most `job` filters one search takes."""
FOLLOW_SETTLE_S = web.AppKey("log_search_settle_s", float)
"""How long after a line was printed a follower of the search is sent it (see the module)."""
FOLLOW_POLL_S = web.AppKey("log_search_poll_s", float)
SETTLE_S = 2.0
"""An agent ships each learner's lines within its flush interval (0.2 s); its clock and the
database's may differ by a little too."""
POLL_S = 0.5
FOLLOW_PAGE = 500


def add_routes(app: web.Application) -> None:
    app.setdefault(FOLLOW_SETTLE_S, SETTLE_S)
    app.setdefault(FOLLOW_POLL_S, POLL_S)
    app.router.add_get("/v1/logs/search", search_logs)


def parse_search(request: web.Request) -> tuple[LogSearch, Cursor | None, int]:
    """The search a request asks for, its cursor and page size; a 400 naming the field for
    anything malformed, and 403 for a tenant naming another tenant."""
    query = request.query
    who = principal(request)
    tenant = acting_tenant(who, params.text(query.get("tenant"), "tenant"), "searches logs")
    raw_pattern = query.get("pattern")
    if raw_pattern is None:
        raise error(400, "pattern is required (what to look for)", field="pattern")
    pattern = params.text(raw_pattern, "pattern", max_length=MAX_PATTERN)
    jobs = [params.uuid(j, "job") for j in query.getall("job", [])]
    if len(jobs) > MAX_JOBS:
        raise error(400, f"at most {MAX_JOBS} job filters", field="job")
    labels: dict[str, str] = {}
    for label in query.getall("label", []):
        key, sep, value = params.text(label, "label", max_length=MAX_KEY * 2).partition("=")
        if not sep or not key:
            raise error(400, f"label filter must be KEY=VALUE, not {label!r}", field="label")
        labels[key] = value
    raw_cursor = query.get("cursor")
    try:
        cursor = Cursor.decode(raw_cursor) if raw_cursor is not None else None
    except ValueError:
        raise error(400, "invalid cursor", field="cursor") from None
    limit = params.integer(query.get("limit"), "limit", minimum=1, maximum=MAX_PAGE)
    try:
        wanted = LogSearch(
            tenant=tenant,
            pattern=pattern,
            regex=params.boolean(query.get("regex"), "regex", default=False),
            ignore_case=params.boolean(query.get("ignore_case"), "ignore_case", default=False),
            jobs=jobs or None,
            labels=labels or None,
            since=params.timestamp(query.get("since"), "since"),
            protocol=params.boolean(query.get("protocol"), "protocol", default=False),
        )
    except PatternError as exc:
        raise error(400, str(exc), field="pattern") from None
    return wanted, cursor, limit or DEFAULT_PAGE


def line_view(stored: StoredLine) -> dict[str, Any]:
    line = stored.line
    return {
        "job_id": str(line.job_id),
        "attempt": line.attempt,
        "learner": line.learner,
        "stream": line.stream.value,
        "seq": line.seq,
        "id": stored.id,
        "at": line.at.isoformat(),
        "line": line.text,
    }


async def search_logs(request: web.Request) -> web.StreamResponse:
    wanted, cursor, limit = parse_search(request)
    if params.boolean(request.query.get("follow"), "follow", default=False):
        if "Last-Event-ID" in request.headers:
            try:
                cursor = Cursor.decode(request.headers["Last-Event-ID"])
            except ValueError:
                raise error(400, "invalid Last-Event-ID", field="Last-Event-ID") from None
        return await _follow(request, wanted, cursor)
    try:
        # One more than the page: whether there is a next page, without a count.
        found = await search(request.app[POOL], wanted, after=cursor, limit=limit + 1)
    except PatternError as exc:
        raise error(400, str(exc), field="pattern") from None
    except SearchTimeout as exc:
        raise error(400, str(exc), field="pattern") from None
    page = found[:limit]
    next_cursor = cursor_of(page[-1]).encode() if len(found) > limit else None
    return web.json_response({"lines": [line_view(s) for s in page], "next_cursor": next_cursor})


def sse_line(stored: StoredLine) -> str:
    # JSON, not the raw line: a bare "\r" in the text would end an SSE line early.
    return (
        f"id: {cursor_of(stored).encode()}\nevent: line\ndata: {json.dumps(line_view(stored))}\n\n"
    )


async def _follow(
    request: web.Request, wanted: LogSearch, after: Cursor | None
) -> web.StreamResponse:
    app = request.app
    settle_s = app[FOLLOW_SETTLE_S]

    async def page(after: Cursor) -> list[StoredLine]:
        try:
            return await newer(app[POOL], wanted, after, settle_s=settle_s, limit=FOLLOW_PAGE)
        except (PatternError, SearchTimeout) as exc:
            raise error(400, str(exc), field="pattern") from None

    if after is None:
        after = await follow_start(app[POOL])
    # The first page before the response is prepared: a bad pattern is still a 400.
    lines = await page(after)
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
                if len(lines) < FOLLOW_PAGE:
                    await asyncio.sleep(app[FOLLOW_POLL_S])
                try:
                    lines = await page(after)
                except web.HTTPBadRequest as exc:
                    # Past the 200: the stream ends with the reason, and the client may resume.
                    await response.write(f"event: error\ndata: {exc.text}\n\n".encode())
                    return response
        except ConnectionResetError:
            pass  # the client went away: nothing is lost, it resumes with Last-Event-ID
    return response


def openapi_paths() -> dict[str, Any]:
    """The OpenAPI path item of this route, to merge into the document's `paths`."""
    error_ref = {"$ref": "#/components/schemas/Error"}

    def param(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "in": "query", "description": description, "schema": schema}

    def failure(description: str) -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": error_ref}}}

    line = {
        "type": "object",
        "required": ["job_id", "attempt", "learner", "stream", "seq", "id", "at", "line"],
        "properties": {
            "job_id": {"type": "string", "format": "uuid"},
            "attempt": {"type": "integer", "minimum": 1},
            "learner": {"type": "integer", "minimum": 0},
            "stream": {"type": "string", "enum": ["stdout", "stderr", "system"]},
            "seq": {"type": "integer", "minimum": 1},
            "id": {"type": "integer", "minimum": 1, "description": "its place in its job's log"},
            "at": {"type": "string", "format": "date-time"},
            "line": {"type": "string"},
        },
    }
    return {
        "/v1/logs/search": {
            "get": {
                "operationId": "searchLogs",
                "summary": "Search the lines of all the tenant's jobs and attempts",
                "description": "Lines that hold `pattern` (a substring; a Postgres regular "
                "expression with `regex=true`), newest first by the time printed, of every job "
                "and attempt of the caller's tenant (an admin names it with `tenant`); the "
                "launcher's protocol lines only with `protocol=true`. `next_cursor`, when not "
                "null, fetches the next (older) page; pages never repeat or skip a line, while "
                f"lines keep arriving. Each search statement may run {STATEMENT_TIMEOUT_MS} ms.",
                "security": [{"bearer": []}],
                "parameters": [
                    {
                        **param(
                            "pattern",
                            f"what to look for (1 to {MAX_PATTERN} characters, one line)",
                            {
                                **params.text_schema(min_length=1, max_length=MAX_PATTERN),
                                "pattern": "^[^\\u0000\\n\\r]*$",
                            },
                        ),
                        "required": True,
                    },
                    param(
                        "regex",
                        "pattern is a regular expression (Postgres's syntax; default false)",
                        {"type": "boolean"},
                    ),
                    param("ignore_case", "match regardless of case", {"type": "boolean"}),
                    param(
                        "job",
                        f"only this job's lines (repeatable, at most {MAX_JOBS})",
                        {"type": "string", "format": "uuid"},
                    ),
                    param(
                        "label",
                        "only jobs with this label, as KEY=VALUE (repeatable: all must hold)",
                        params.label_filter_schema(MAX_KEY * 2),
                    ),
                    param(
                        "since",
                        "only lines printed at or after this time (RFC 3339)",
                        {"type": "string", "format": "date-time"},
                    ),
                    param(
                        "protocol",
                        "include the launcher's reports (`@@trainyard/1 {...}`; default false)",
                        {"type": "boolean"},
                    ),
                    param(
                        "limit",
                        f"lines per page (default {DEFAULT_PAGE})",
                        params.schema(minimum=1, maximum=MAX_PAGE),
                    ),
                    param("cursor", "the previous page's next_cursor", params.CURSOR_SCHEMA),
                    param(
                        "follow",
                        "stream new matching lines as SSE, oldest first, from now on (default "
                        "false; limit and cursor do not apply)",
                        {"type": "boolean"},
                    ),
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "description": "follow=true: resume after this line (its SSE id)",
                        "schema": {"type": "string"},
                    },
                    param("tenant", "the tenant searched (admin only)", params.text_schema()),
                ],
                "responses": {
                    "200": {
                        "description": "a page of matching lines, newest first; with "
                        "follow=true, SSE: each new line an `event: line` whose `data` is a line "
                        "as in the page and whose `id` resumes after it, comment heartbeats while "
                        "idle, and `event: error` (data: an Error) if a later poll fails",
                        "content": {
                            "text/event-stream": SSE_EVENT,
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["lines", "next_cursor"],
                                    "properties": {
                                        "lines": {"type": "array", "items": line},
                                        "next_cursor": {"type": ["string", "null"]},
                                    },
                                }
                            },
                        },
                    },
                    "400": failure(
                        "malformed parameter (the field names which): an empty, too long or "
                        "invalid pattern, or one whose search ran past the time limit; an "
                        "admin without tenant"
                    ),
                    "401": failure("missing or wrong token"),
                    "403": failure("a tenant's token naming another tenant"),
                    "429": failure(
                        "follow=true: the tenant's live streams limit, or the server's, reached; "
                        "Retry-After"
                    ),
                },
            }
        }
    }
