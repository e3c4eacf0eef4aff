"""Why a job is pending: `GET /v1/jobs/{job_id}/pending` (its reasons now, its queue position
and its history, with the time each reason held it in a window) and the same as an SSE stream
(`/pending/events`), sent again whenever it changes. The handlers route and authenticate; the
pending feature's facade (`controlplane.pending.application`) decides."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated

from aiohttp import web
from pydantic import Field

from controlplane.http import query
from controlplane.http.auth import principal
from controlplane.http.jobs import JOB_ID, visible_job
from controlplane.http.keys import PLANE, TASKS
from controlplane.http.operations import Answer, Operation, add_operations, answer
from controlplane.http.streams import SSE_EVENT, SSE_HEADERS, live_stream
from controlplane.instruments import sse_client
from controlplane.pending.application import PendingApplication
from controlplane.pending.recorder import ROUND_S
from controlplane.pending.views import PendingNow, PendingView

PENDING_APPLICATION = web.AppKey("pending_application", PendingApplication)


class WindowQuery(query.Query):
    since: Annotated[datetime | None, query.INSTANT] = Field(
        default=None,
        description="`seconds` counts from this instant (RFC 3339) on (default: the first)",
    )
    until: Annotated[datetime | None, query.INSTANT] = Field(
        default=None,
        description="`seconds` counts from this instant (RFC 3339) back (default: now)",
    )


async def get_pending(request: web.Request) -> web.Response:
    job = await visible_job(request, principal(request))
    window = query.parsed(request, WindowQuery)
    view = await request.app[PENDING_APPLICATION].view(job, since=window.since, until=window.until)
    return answer(view)


async def stream_pending(request: web.Request) -> web.StreamResponse:
    """SSE: a `pending` event (the view, history left out) now and whenever the job's reasons,
    position or state change, looked at each recorder round; it ends once the job has ended."""
    job = await visible_job(request, principal(request))
    pending, tasks = request.app[PENDING_APPLICATION], request.app[TASKS]
    response = web.StreamResponse(headers=SSE_HEADERS)
    with await live_stream(request):
        await response.prepare(request)
        try:
            with sse_client("pending"):
                sent: PendingNow | None = None
                while True:
                    view = await pending.now(job)
                    if view != sent:
                        sent = view
                        data = json.dumps(view.model_dump(mode="json", by_alias=True))
                        await response.write(f"event: pending\ndata: {data}\n\n".encode())
                    else:
                        await response.write(b": heartbeat\n\n")
                    if job.state.terminal or await tasks.pause(ROUND_S):
                        break
                    job = await pending.reload(job)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away; nothing is lost (the view is read again)
    return response


_NOT_FOUND = "no such job (or none of the caller's)"
OPERATIONS = (
    Operation(
        "get",
        "/v1/jobs/{job_id}/pending",
        get_pending,
        "getJobPending",
        "Why the job is pending: every reason now, its queue position, and the history of its "
        "reasons with the time each held it",
        {200: Answer("the job's pending reasons", PendingView)},
        {
            400: "malformed request: a parameter (the field names which); until before since",
            401: "missing or wrong token",
            404: _NOT_FOUND,
        },
        query=WindowQuery,
        params=(JOB_ID,),
    ),
    Operation(
        "get",
        "/v1/jobs/{job_id}/pending/events",
        stream_pending,
        "streamJobPending",
        "SSE: a `pending` event (reasons, position, state) now and at each change; ends once "
        "the job has ended",
        {
            200: Answer(
                "text/event-stream of `pending` events (each a PendingNow)",
                SSE_EVENT["schema"],
                media="text/event-stream",
            )
        },
        {401: "missing or wrong token", 404: _NOT_FOUND, 429: "over the tenant's live streams"},
        params=(JOB_ID,),
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
    app.on_startup.append(_open)


async def _open(app: web.Application) -> None:
    # After the composition root's parts are open (cleanup contexts start first).
    plane = app[PLANE]
    app[PENDING_APPLICATION] = PendingApplication(plane.jobs, plane.pool)
