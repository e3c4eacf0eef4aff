"""`GET /v1/jobs/{job_id}/logs`: a job's learner logs as plain text, or followed as SSE.

Plain text (the default) is every stored line, in the order stored, one per line:

    [attempt 1 learner 0 stdout] epoch 3 loss 0.12

What the user printed, by default: the launcher's reports to the agent (`@@trainyard/1 {...}`
lines on stdout: phases, metrics, checkpoints; see `runners.protocol`) are stored with the rest
but left out unless `?protocol=true` (the CLI asks for them and shows them readably).

With `?follow=true` it is SSE instead: each line is an `event: line` whose `id` is the line's
per-job id (send it back as `Last-Event-ID`, or `?after=`, to resume exactly after it) and whose
`data` is JSON (`attempt`, `learner`, `stream`, `seq`, `at`, `line`), so that any character of
a line survives. A comment heartbeat is sent while idle. Once the job has ended, all its
learners have ended (their allocations are released), everything stored has been sent and the
log has been quiet for the settle time (for the agent's last batch), an `event: end` (with no
`id`, so it moves no cursor) says the log is complete and the stream ends. A line that comes
later still (from an agent cut off from the database for longer) stays readable, by text or by
resuming.

New lines are found by polling, one index probe per followed job per interval, whatever its
number of followers (they share one reader, see `controlplane.logs.feeds`): a NOTIFY per stored
batch would take Postgres's global notify lock at the commit of every batch, on the hottest
write path. Changes of the job's state come from the app's stream hub (no polling).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from aiohttp import web

from controlplane.http import log_search, params
from controlplane.http.auth import principal
from controlplane.http.jobs import visible_job
from controlplane.http.keys import HUB, JOBS, POOL, SSE_HEARTBEAT_S
from controlplane.http.streams import SSE_EVENT, SSE_HEADERS, live_stream
from controlplane.instruments import sse_client
from controlplane.logs.feeds import FOLLOWER_LINES, LAGGED, End, Follower, Lines, LogFeeds
from controlplane.logs.lines import StoredLine, Stream
from controlplane.logs.store import read_lines
from runners import protocol

LOG_SETTLE_S = web.AppKey("log_settle_s", float)
"""How long an ended job's log must have been quiet before a follower's stream ends."""
LOG_POLL_S = web.AppKey("log_poll_s", float)
"""How often a followed job's feed looks for new lines."""
LOG_FOLLOWER_LINES = web.AppKey("log_follower_lines", int)
"""The most lines queued for one follower; one that falls further behind reads the database."""
LOG_FEEDS = web.AppKey("log_feeds", LogFeeds)

SETTLE_S = 3.0
"""After its learners have ended, an agent ships their last lines within its flush interval
(0.2 s), or a few retries later when a write fails."""
POLL_S = 0.25
PAGE = 1000


def add_routes(app: web.Application) -> None:
    app.setdefault(LOG_SETTLE_S, SETTLE_S)
    app.setdefault(LOG_POLL_S, POLL_S)
    app.setdefault(LOG_FOLLOWER_LINES, FOLLOWER_LINES)
    app.cleanup_ctx.append(_feeds)
    app.router.add_get("/v1/jobs/{job_id}/logs", get_logs)
    log_search.add_routes(app)


async def _feeds(app: web.Application) -> AsyncIterator[None]:
    """The followed jobs' feeds, on the app's pool and hub (set up before, closed after)."""
    feeds = LogFeeds(
        app[POOL],
        app[HUB],
        app[JOBS],
        poll_s=app[LOG_POLL_S],
        settle_s=app[LOG_SETTLE_S],
        capacity=app[LOG_FOLLOWER_LINES],
    )
    app[LOG_FEEDS] = feeds
    yield
    await feeds.close()


@dataclass(frozen=True, slots=True)
class LogQuery:
    attempt: int | None
    learner: int | None
    follow: bool
    after: int
    protocol: bool
    """Whether the launcher's protocol lines are included."""


def parse_query(query: Mapping[str, str], headers: Mapping[str, str]) -> LogQuery:
    """The request's filters and cursor; a 400 naming the field for anything malformed."""
    return LogQuery(
        attempt=params.integer(query.get("attempt"), "attempt", minimum=1),
        learner=params.integer(query.get("learner"), "learner", minimum=0),
        follow=params.boolean(query.get("follow"), "follow", default=False),
        after=params.resume_after(query, headers),
        protocol=params.boolean(query.get("protocol"), "protocol", default=False),
    )


def is_report(stored: StoredLine) -> bool:
    """Whether the line is one of the launcher's reports to the agent, not the user's output."""
    line = stored.line
    return (
        line.stream is Stream.STDOUT
        and line.text.startswith(protocol.PREFIX)
        and protocol.parse(line.text) is not None
    )


async def get_logs(request: web.Request) -> web.StreamResponse:
    query = parse_query(request.query, request.headers)
    job = await visible_job(request, principal(request))
    if query.follow:
        response = web.StreamResponse(headers=SSE_HEADERS)
    else:
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
    # A follow lives until the job ends: a live stream, counted against the limits.
    with await live_stream(request) if query.follow else nullcontext():
        await response.prepare(request)
        try:
            if query.follow:
                with sse_client("logs"):
                    await _follow(request, response, job.job_id, query)
            else:
                await _text(request, response, job.job_id, query)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away: nothing left to send, and nothing is lost (it resumes)
    return response


def text_line(stored: StoredLine) -> str:
    line = stored.line
    return f"[attempt {line.attempt} learner {line.learner} {line.stream}] {line.text}\n"


def sse_message(stored: StoredLine) -> str:
    line = stored.line
    data = {
        "attempt": line.attempt,
        "learner": line.learner,
        "stream": line.stream.value,
        "seq": line.seq,
        "at": line.at.isoformat(),
        "line": line.text,
    }
    # JSON, not the raw line: a bare "\r" in the text would end an SSE line early.
    return f"id: {stored.id}\nevent: line\ndata: {json.dumps(data)}\n\n"


async def _text(
    request: web.Request, response: web.StreamResponse, job_id: UUID, query: LogQuery
) -> None:
    after = query.after
    while True:
        page = await _page(request, job_id, query, after)
        if shown := _shown(page, query):
            await response.write("".join(map(text_line, shown)).encode())
        if len(page) < PAGE:
            return
        after = page[-1].id


async def _page(
    request: web.Request, job_id: UUID, query: LogQuery, after: int
) -> list[StoredLine]:
    return await read_lines(
        request.app[POOL],
        job_id,
        attempt=query.attempt,
        learner=query.learner,
        after=after,
        limit=PAGE,
    )


def _shown(page: list[StoredLine], query: LogQuery) -> list[StoredLine]:
    if query.protocol:
        return page
    return [stored for stored in page if not is_report(stored)]


async def _follow(
    request: web.Request, response: web.StreamResponse, job_id: UUID, query: LogQuery
) -> None:
    app = request.app
    heartbeat_s = app[SSE_HEARTBEAT_S]
    loop = asyncio.get_running_loop()
    after = query.after
    written = loop.time()

    async def send(lines: list[StoredLine]) -> None:
        nonlocal written
        if shown := _shown(lines, query):
            await response.write("".join(map(sse_message, shown)).encode())
            written = loop.time()

    async def catch_up() -> None:
        """Read from the database up to its end as of now (the feed brings what follows)."""
        nonlocal after
        while True:
            page = await _page(request, job_id, query, after)
            await send(page)
            if page:
                after = page[-1].id
            if len(page) < PAGE:
                return

    # Subscribed before reading what is stored, so that nothing falls between.
    with app[LOG_FEEDS].follow(job_id) as feed:
        await catch_up()
        while True:
            item = await _next(feed, heartbeat_s - (loop.time() - written))
            if item is _HEARTBEAT:
                await response.write(b": heartbeat\n\n")
                written = loop.time()
            elif item is LAGGED:
                await catch_up()  # the queue was emptied: it fell behind
            elif isinstance(item, Lines):
                # Left-out lines (filtered, or reports) move the cursor too; lines read in the
                # catch-up come again from the feed, and are left out by id.
                await send([s for s in item.lines if s.id > after and _matches(s, query)])
                after = max(after, item.upto)
            elif isinstance(item, End):
                end = {"state": item.state, "last_id": max(after, item.upto)}
                await response.write(f"event: end\ndata: {json.dumps(end)}\n\n".encode())
                return
            else:
                return  # the server is shutting down; the client resumes elsewhere


_HEARTBEAT = object()


async def _next(feed: Follower, wait_s: float) -> object:
    """The feed's next item, or _HEARTBEAT when none comes within `wait_s`."""
    try:
        async with asyncio.timeout(max(wait_s, 0)):
            return await feed.next()
    except TimeoutError:
        return _HEARTBEAT


def _matches(stored: StoredLine, query: LogQuery) -> bool:
    line = stored.line
    return (query.attempt is None or line.attempt == query.attempt) and (
        query.learner is None or line.learner == query.learner
    )


def openapi_paths() -> dict[str, Any]:
    """The OpenAPI path item of this route, to merge into the document's `paths`."""
    error_ref = {"$ref": "#/components/schemas/Error"}

    def param(name: str, where: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "in": where, "description": description, "schema": schema}

    def failure(description: str) -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": error_ref}}}

    return {
        "/v1/jobs/{job_id}/logs": {
            "get": {
                "operationId": "getJobLogs",
                "summary": "The job's learner logs, as text or followed as server-sent events",
                "description": "Lines in the order stored; the launcher's protocol lines only "
                "with `protocol=true`. Text: one line each, as "
                "`[attempt N learner I STREAM] text`. With `follow=true`, SSE: each line an "
                "`event: line` whose `id` resumes exactly after it (`Last-Event-ID` or "
                "`after`) and whose `data` is JSON with `attempt`, `learner`, `stream` "
                "(stdout, stderr or system), `seq`, `at` and `line`; comment heartbeats while "
                "idle; once the job and all its learners have ended and its log has gone quiet, "
                "an `event: end` (data: `state`, `last_id`; no `id`) and the end of the stream.",
                "security": [{"bearer": []}],
                "parameters": [
                    {
                        **param("job_id", "path", "the job's id", {"type": "string"}),
                        "required": True,
                    },
                    param("attempt", "query", "only this attempt", params.schema(minimum=1)),
                    param("learner", "query", "only this learner", params.schema(minimum=0)),
                    param(
                        "follow",
                        "query",
                        "stream as SSE until the job has ended (default false)",
                        {"type": "boolean"},
                    ),
                    param(
                        "protocol",
                        "query",
                        "include the launcher's reports to the agent (`@@trainyard/1 {...}` "
                        "lines on stdout: phases, metrics, checkpoints), stored with the "
                        "learner's output (default false: only what the user's command printed)",
                        {"type": "boolean"},
                    ),
                    param(
                        "Last-Event-ID",
                        "header",
                        "resume after this line id",
                        params.POSITION_SCHEMA,
                    ),
                    param(
                        "after",
                        "query",
                        "same as Last-Event-ID",
                        params.POSITION_SCHEMA,
                    ),
                ],
                "responses": {
                    "200": {
                        "description": "the lines",
                        "content": {
                            "text/plain": {"schema": {"type": "string"}},
                            "text/event-stream": SSE_EVENT,
                        },
                    },
                    "400": failure("malformed query parameter or Last-Event-ID"),
                    "401": failure("missing or wrong token"),
                    "404": failure("no such job (or another tenant's)"),
                    "429": failure(
                        "follow=true: the tenant's live streams limit, or the server's, reached; "
                        "Retry-After"
                    ),
                },
            }
        }
    }
