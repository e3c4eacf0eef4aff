"""`GET /v1/jobs/{job_id}/logs`: a job's learner logs as plain text, or followed as SSE.

Plain text (the default) is every stored line, in the order stored, one per line:

    [attempt 1 learner 0 stdout] epoch 3 loss 0.12

With `?follow=true` it is SSE instead: each line is an `event: line` whose `id` is the line's
per-job id (send it back as `Last-Event-ID`, or `?after=`, to resume exactly after it) and whose
`data` is JSON (`attempt`, `learner`, `stream`, `seq`, `at`, `line`), so that any character of
a line survives. A comment heartbeat is sent while idle. Once the job has ended, all its
learners have ended (their allocations are released), everything stored has been sent and the
log has been quiet for the settle time (for the agent's last batch), an `event: end` (with no
`id`, so it moves no cursor) says the log is complete and the stream ends. A line that comes
later still (from an agent cut off from the database for longer) stays readable, by text or by
resuming.

New lines are found by polling, one index probe per follower per interval: a NOTIFY per
stored batch would take Postgres's global notify lock at the commit of every batch, on the
hottest write path. Changes of the job's state come from the app's stream hub (no polling).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from aiohttp import web

from controlplane.http.errors import error
from controlplane.http.jobs import _visible_job
from controlplane.http.keys import HUB, JOBS, POOL, SSE_HEARTBEAT_S
from controlplane.http.streams import live_stream
from controlplane.instruments import sse_client
from controlplane.jobs.events import JobEvent
from controlplane.jobs.lifecycle import JobStatus, replay
from controlplane.jobs.service import Jobs
from controlplane.jobs.streams import job_stream
from controlplane.logs.lines import StoredLine
from controlplane.logs.store import quiet_s, read_lines
from controlplane.tenants.auth import principal

LOG_SETTLE_S = web.AppKey("log_settle_s", float)
"""How long an ended job's log must have been quiet before a follower's stream ends."""
LOG_POLL_S = web.AppKey("log_poll_s", float)
"""How often a follower looks for new lines."""

SETTLE_S = 3.0
"""After its learners have ended, an agent ships their last lines within its flush interval
(0.2 s), or a few retries later when a write fails."""
POLL_S = 0.25
PAGE = 1000

_SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
_TRUE, _FALSE = frozenset({"true", "1"}), frozenset({"false", "0"})


def add_routes(app: web.Application) -> None:
    app.setdefault(LOG_SETTLE_S, SETTLE_S)
    app.setdefault(LOG_POLL_S, POLL_S)
    app.router.add_get("/v1/jobs/{job_id}/logs", get_logs)


@dataclass(frozen=True, slots=True)
class LogQuery:
    attempt: int | None
    learner: int | None
    follow: bool
    after: int


def parse_query(query: Mapping[str, str], headers: Mapping[str, str]) -> LogQuery:
    """The request's filters and cursor; a 400 naming the field for anything malformed."""
    follow = query.get("follow", "false").lower()
    if follow not in _TRUE | _FALSE:
        raise error(400, "follow must be true or false", field="follow")
    if "Last-Event-ID" in headers:
        after = _integer(headers["Last-Event-ID"], "Last-Event-ID")
    else:
        after = _integer(query.get("after"), "after")
    return LogQuery(
        attempt=_integer(query.get("attempt"), "attempt", minimum=1),
        learner=_integer(query.get("learner"), "learner", minimum=0),
        follow=follow in _TRUE,
        after=after or 0,
    )


def _integer(raw: str | None, field: str, *, minimum: int = 0) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise error(400, f"{field} must be an integer", field=field) from None
    if value < minimum:
        raise error(400, f"{field} must be at least {minimum}", field=field)
    return value


async def get_logs(request: web.Request) -> web.StreamResponse:
    query = parse_query(request.query, request.headers)
    job = await _visible_job(request, principal(request))
    if query.follow:
        response = web.StreamResponse(headers=_SSE_HEADERS)
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
        if page:
            await response.write("".join(map(text_line, page)).encode())
            after = page[-1].id
        if len(page) < PAGE:
            return


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


async def _follow(
    request: web.Request, response: web.StreamResponse, job_id: UUID, query: LogQuery
) -> None:
    app = request.app
    settle_s, poll_s, heartbeat_s = app[LOG_SETTLE_S], app[LOG_POLL_S], app[SSE_HEARTBEAT_S]
    loop = asyncio.get_running_loop()
    # Subscribe before reading the job's state, so that no change in between is missed.
    with app[HUB].subscribe(job_stream(job_id)) as changes:
        ended_at, state = await _ended(app[JOBS], job_id)
        after = query.after
        written = loop.time()
        while True:
            # How long the log has been quiet (None while the job runs or a learner is still
            # allocated), asked BEFORE reading the lines: every batch that counted towards it
            # has then been read, so the stream never ends short of one.
            quiet = None if ended_at is None else await quiet_s(app[POOL], job_id, ended_at)
            page = await _page(request, job_id, query, after)
            if page:
                await response.write("".join(map(sse_message, page)).encode())
                after, written = page[-1].id, loop.time()
                if len(page) == PAGE:
                    continue
            if quiet is not None and quiet >= settle_s:
                end = {"state": state, "last_id": after}
                await response.write(f"event: end\ndata: {json.dumps(end)}\n\n".encode())
                return
            try:
                async with asyncio.timeout(poll_s):
                    change = await changes.next()
            except TimeoutError:
                pass  # time to look for lines again
            else:
                if change is None:
                    return  # the server is shutting down; the client resumes elsewhere
                # A job event (or LAGGED: some were missed): read the job's state again.
                ended_at, state = await _ended(app[JOBS], job_id)
            if loop.time() - written >= heartbeat_s:
                await response.write(b": heartbeat\n\n")
                written = loop.time()


async def _ended(jobs: Jobs, job_id: UUID) -> tuple[datetime | None, JobStatus]:
    """When (by the database's clock) the job ended, None while it runs; and its state."""
    history = await jobs.history(job_id)
    events: list[JobEvent] = []
    for recorded in history:
        assert isinstance(recorded.event, JobEvent)  # a job's stream holds only job events
        events.append(recorded.event)
    job = replay(events)
    assert job is not None  # the route has found the job already
    # A terminal state is final: its event is the stream's last.
    return (history[-1].recorded_at if job.state.terminal else None), job.state


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
                "summary": "The job's learner logs, as text or followed as server-sent events",
                "description": "Lines in the order stored. Text: one line each, as "
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
                    param(
                        "attempt", "query", "only this attempt", {"type": "integer", "minimum": 1}
                    ),
                    param(
                        "learner", "query", "only this learner", {"type": "integer", "minimum": 0}
                    ),
                    param(
                        "follow",
                        "query",
                        "stream as SSE until the job has ended (default false)",
                        {"type": "boolean"},
                    ),
                    param(
                        "Last-Event-ID",
                        "header",
                        "resume after this line id",
                        {"type": "integer", "minimum": 0},
                    ),
                    param(
                        "after",
                        "query",
                        "same as Last-Event-ID",
                        {"type": "integer", "minimum": 0},
                    ),
                ],
                "responses": {
                    "200": {
                        "description": "the lines",
                        "content": {
                            "text/plain": {"schema": {"type": "string"}},
                            "text/event-stream": {"schema": {"type": "string"}},
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
