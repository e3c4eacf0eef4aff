"""Why a job is pending: `GET /v1/jobs/{job_id}/pending` (its reasons now, its queue position
and its history, with the time each reason held it in a window) and the same as an SSE stream
(`/pending/events`), sent again whenever it changes."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from controlplane.http import params
from controlplane.http.auth import principal
from controlplane.http.errors import error
from controlplane.http.jobs import visible_job
from controlplane.http.keys import JOBS, PLANE, POOL, TASKS
from controlplane.http.streams import SSE_HEADERS, live_stream
from controlplane.instruments import sse_client
from controlplane.jobs.lifecycle import Job
from controlplane.pending.recorder import ROUND_S
from controlplane.pending.views import pending_view


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/jobs/{job_id}/pending", get_pending)
    app.router.add_get("/v1/jobs/{job_id}/pending/events", stream_pending)


async def get_pending(request: web.Request) -> web.Response:
    job = await visible_job(request, principal(request))
    since = params.timestamp(request.query.get("since"), "since")
    until = params.timestamp(request.query.get("until"), "until")
    if since and until and until < since:
        raise error(400, "until must not be before since", field="until")
    now = request.app[PLANE].clock.now()
    view = await pending_view(request.app[POOL], job, now, since=since, until=until)
    return web.json_response(view)


async def stream_pending(request: web.Request) -> web.StreamResponse:
    """SSE: a `pending` event (the view, history left out) now and whenever the job's reasons,
    position or state change, looked at each recorder round; it ends once the job has ended."""
    job = await visible_job(request, principal(request))
    response = web.StreamResponse(headers=SSE_HEADERS)
    jobs, tasks = request.app[JOBS], request.app[TASKS]
    with await live_stream(request):
        await response.prepare(request)
        try:
            with sse_client("pending"):
                sent: dict[str, Any] | None = None
                while True:
                    view = await _now(request, job)
                    if view != sent:
                        sent = view
                        await response.write(
                            f"event: pending\ndata: {json.dumps(view)}\n\n".encode()
                        )
                    else:
                        await response.write(b": heartbeat\n\n")
                    if job.state.terminal or await tasks.pause(ROUND_S):
                        break
                    job = await jobs.load(job.job_id) or job
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away; nothing is lost (the view is read again)
    return response


async def _now(request: web.Request, job: Job) -> dict[str, Any]:
    now = request.app[PLANE].clock.now()
    view = await pending_view(request.app[POOL], job, now)
    # The history's open spans and the seconds grow every round: what changed is the rest.
    return {k: v for k, v in view.items() if k not in ("history", "seconds")}
