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

The handler routes and authenticates; what it reads comes from the logs feature's facade
(`controlplane.logs.application`). Writing the lines (text, SSE) is this module's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import nullcontext
from typing import Annotated
from uuid import UUID

from aiohttp import web
from pydantic import Field

from controlplane.http import log_search, params, query
from controlplane.http.auth import principal
from controlplane.http.jobs import JOB_ID, visible_job
from controlplane.http.keys import HUB, JOBS, POOL, SSE_HEARTBEAT_S
from controlplane.http.log_search import LOGS_APPLICATION
from controlplane.http.operations import Answer, Operation, Param, add_operations
from controlplane.http.streams import SSE_EVENT, SSE_HEADERS, live_stream
from controlplane.instruments import sse_client
from controlplane.logs.application import LogsApplication, Shown
from controlplane.logs.feeds import FOLLOWER_LINES, LAGGED, End, Follower, Lines, LogFeeds
from controlplane.logs.lines import StoredLine
from controlplane.logs.views import LineView

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


class LogQuery(query.Query):
    attempt: Annotated[int | None, query.integer(1)] = Field(
        default=None, description="only this attempt"
    )
    learner: Annotated[int | None, query.integer(0)] = Field(
        default=None, description="only this learner"
    )
    follow: Annotated[bool, query.BOOLEAN] = Field(
        default=False, description="stream as SSE until the job has ended (default false)"
    )
    after: Annotated[int | None, query.integer(0, params.INT8_MAX)] = Field(
        default=None, description="same as Last-Event-ID"
    )
    protocol: Annotated[bool, query.BOOLEAN] = Field(
        default=False,
        description="include the launcher's reports to the agent (`@@trainyard/1 {...}` lines "
        "on stdout: phases, metrics, checkpoints), stored with the learner's output (default "
        "false: only what the user's command printed)",
    )

    def shown(self) -> Shown:
        return Shown(attempt=self.attempt, learner=self.learner, protocol=self.protocol)


async def get_logs(request: web.Request) -> web.StreamResponse:
    asked = query.parsed(request, LogQuery)
    after = params.resume_after(request.query, request.headers)
    job = await visible_job(request, principal(request))
    logs = request.app[LOGS_APPLICATION]
    if asked.follow:
        response = web.StreamResponse(headers=SSE_HEADERS)
    else:
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
    # A follow lives until the job ends: a live stream, counted against the limits.
    with await live_stream(request) if asked.follow else nullcontext():
        await response.prepare(request)
        try:
            if asked.follow:
                with sse_client("logs"):
                    await _follow(request, response, logs, job.job_id, asked.shown(), after)
            else:
                await _text(response, logs, job.job_id, asked.shown(), after)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away: nothing left to send, and nothing is lost (it resumes)
    return response


def text_line(stored: StoredLine) -> str:
    line = stored.line
    return f"[attempt {line.attempt} learner {line.learner} {line.stream}] {line.text}\n"


def sse_message(stored: StoredLine) -> str:
    data = LineView.of(stored).model_dump(mode="json")
    # JSON, not the raw line: a bare "\r" in the text would end an SSE line early.
    return f"id: {stored.id}\nevent: line\ndata: {json.dumps(data)}\n\n"


async def _text(
    response: web.StreamResponse, logs: LogsApplication, job_id: UUID, shown: Shown, after: int
) -> None:
    while True:
        page = await logs.page(job_id, shown, after)
        if page.lines:
            await response.write("".join(map(text_line, page.lines)).encode())
        if page.complete or page.last_id is None:
            return
        after = page.last_id


async def _follow(
    request: web.Request,
    response: web.StreamResponse,
    logs: LogsApplication,
    job_id: UUID,
    shown: Shown,
    after: int,
) -> None:
    heartbeat_s = request.app[SSE_HEARTBEAT_S]
    loop = asyncio.get_running_loop()
    written = loop.time()

    async def send(lines: list[StoredLine]) -> None:
        nonlocal written
        if lines:
            await response.write("".join(map(sse_message, lines)).encode())
            written = loop.time()

    async def catch_up() -> None:
        """Read from the database up to its end as of now (the feed brings what follows)."""
        nonlocal after
        while True:
            page = await logs.page(job_id, shown, after)
            await send(page.lines)
            if page.last_id is not None:
                after = page.last_id
            if page.complete:
                return

    # Subscribed before reading what is stored, so that nothing falls between.
    with logs.follow(job_id) as feed:
        await catch_up()
        while True:
            item = await _next(feed, heartbeat_s - (loop.time() - written))
            if item is _HEARTBEAT:
                await response.write(b": heartbeat\n\n")
                written = loop.time()
            elif item is LAGGED:
                # It fell behind (its queue was emptied), or its catch-up raced the start of
                # the feed, which brings only what follows the log's head as it read it.
                await catch_up()
            elif isinstance(item, Lines):
                # Left-out lines (filtered, or reports) move the cursor too; lines read in the
                # catch-up come again from the feed, and are left out by id.
                await send([s for s in item.lines if s.id > after and shown.shows(s)])
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


OPERATIONS = (
    Operation(
        "get",
        "/v1/jobs/{job_id}/logs",
        get_logs,
        "getJobLogs",
        "The job's learner logs, as text or followed as server-sent events",
        {
            200: Answer(
                "the lines",
                {"type": "string"},
                media="text/plain",
                also={"text/event-stream": SSE_EVENT},
            )
        },
        {
            400: "malformed query parameter or Last-Event-ID",
            401: "missing or wrong token",
            404: "no such job (or another tenant's)",
            429: "follow=true: the tenant's live streams limit, or the server's, reached; "
            "Retry-After",
        },
        description="Lines in the order stored; the launcher's protocol lines only with "
        "`protocol=true`. Text: one line each, as `[attempt N learner I STREAM] text`. With "
        "`follow=true`, SSE: each line an `event: line` whose `id` resumes exactly after it "
        "(`Last-Event-ID` or `after`) and whose `data` is JSON with `attempt`, `learner`, "
        "`stream` (stdout, stderr or system), `seq`, `at` and `line`; comment heartbeats while "
        "idle; once the job and all its learners have ended and its log has gone quiet, an "
        "`event: end` (data: `state`, `last_id`; no `id`) and the end of the stream.",
        query=LogQuery,
        params=(
            JOB_ID,
            Param("Last-Event-ID", "header", "resume after this line id", params.POSITION_SCHEMA),
        ),
    ),
)


def add_routes(app: web.Application) -> None:
    app.setdefault(LOG_SETTLE_S, SETTLE_S)
    app.setdefault(LOG_POLL_S, POLL_S)
    app.setdefault(LOG_FOLLOWER_LINES, FOLLOWER_LINES)
    app.cleanup_ctx.append(_feeds)
    add_operations(app, OPERATIONS)
    log_search.add_routes(app)


async def _feeds(app: web.Application) -> AsyncIterator[None]:
    """The followed jobs' feeds, on the app's pool and hub (set up before, closed after), and
    the facade that reads through them."""
    feeds = LogFeeds(
        app[POOL],
        app[HUB],
        app[JOBS],
        poll_s=app[LOG_POLL_S],
        settle_s=app[LOG_SETTLE_S],
        capacity=app[LOG_FOLLOWER_LINES],
    )
    app[LOG_FEEDS] = feeds
    app[LOGS_APPLICATION] = LogsApplication(app[POOL], feeds)
    yield
    await feeds.close()
