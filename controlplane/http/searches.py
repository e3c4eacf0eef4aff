"""Searches over HTTP: submit one (`POST /v1/searches`), list them, read one with its trials,
its trials' metric curves (a page of many trials in one response, for a dashboard's chart)
and its best trial (as a job manifest to run again), cancel one, and follow one's decisions as
they are recorded (SSE). A tenant sees its own searches; another's is "not found"."""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Any
from uuid import UUID

from aiohttp import web
from pydantic import ValidationError

from controlplane.admission.policy import Room
from controlplane.events.records import RecordedEvent
from controlplane.http import params
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.errors import error, validation_error
from controlplane.http.jobs import JOBS_APPLICATION
from controlplane.http.keys import (
    IMAGES,
    PLANE,
    POOL,
)
from controlplane.http.requests import event_metadata, idempotency_key, json_body
from controlplane.http.stream_events import follow
from controlplane.http.streams import SSE_HEADERS, live_stream
from controlplane.instruments import sse_client
from controlplane.jobs.application import MAX_PAGE, decode_cursor, encode_cursor
from controlplane.jobs.images import ImageRefused
from controlplane.searches.events import SearchEnded
from controlplane.searches.lifecycle import SEARCH, Search, SearchBusy, SearchRefused
from controlplane.searches.service import SearchMismatch, new_search_id
from controlplane.searches.spec import SearchSpec
from controlplane.searches.streams import search_stream
from controlplane.searches.views import (
    CURVE_POINTS,
    MAX_CURVE_POINTS,
    MAX_CURVE_TRIALS,
    best_manifest,
    curves,
    list_searches,
    search_row,
    search_view,
    trials,
)

STATES = ("running", "completed", "failed", "cancelled")
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,63}")
"""As a search's metric is named (`searches.spec.Metric`): also what learners may report."""


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/searches", submit)
    app.router.add_get("/v1/searches", list_all)
    app.router.add_get("/v1/searches/{search_id}", get_search)
    app.router.add_get("/v1/searches/{search_id}/trials", get_trials)
    app.router.add_get("/v1/searches/{search_id}/curves", get_curves)
    app.router.add_get("/v1/searches/{search_id}/best", get_best)
    app.router.add_post("/v1/searches/{search_id}/cancel", cancel)
    app.router.add_get("/v1/searches/{search_id}/events", stream_events)


async def submit(request: web.Request) -> web.Response:
    who = principal(request)
    body = await json_body(request)
    try:
        spec = SearchSpec.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from exc
    template = spec.trial
    try:
        request.app[IMAGES].admit(template.image)
    except ImageRefused as exc:
        raise error(422, str(exc), field="trial.image") from exc
    tenant = acting_tenant(who, params.text(request.query.get("tenant"), "tenant"), "submits")
    key = idempotency_key(request)
    await request.app[JOBS_APPLICATION].check_manifest(template, tenant, field_prefix="trial.")
    searches = request.app[PLANE].searches
    # A retry of a submission that was accepted finds its search whatever the limits say now;
    # a new one is held to the tenant's rate, queue and largest node, as a job is (its trials
    # are jobs), and runs at most as many trials at once as the tenant may queue jobs.
    if key is None or await searches.load(new_search_id(tenant, key)) is None:
        limits = await request.app[JOBS_APPLICATION].admit(tenant, template, also=Room(searches=1))
        if spec.max_concurrent_trials > limits.queued_jobs:
            raise error(
                422,
                f"max_concurrent_trials {spec.max_concurrent_trials} is more than tenant "
                f"{tenant!r} may queue jobs ({limits.queued_jobs})",
                field="max_concurrent_trials",
            )
    try:
        search, created = await searches.submit(
            tenant, spec, event_metadata(request, who, tenant), key
        )
    except SearchMismatch as exc:
        raise error(409, str(exc)) from exc
    headers = {"Location": f"/v1/searches/{search.search_id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    view = {
        "id": str(search.search_id),
        "tenant": search.tenant,
        "name": spec.name,
        "state": search.state,
        "trials": len(search.trials),
    }
    return web.json_response(view, status=201, headers=headers)


async def list_all(request: web.Request) -> web.Response:
    who = principal(request)
    query = request.query
    state = query.get("state")
    if state is not None:
        state = params.choice(state, "state", STATES)
    limit = params.integer(query.get("limit"), "limit", minimum=1, maximum=MAX_PAGE) or 50
    found, total = await list_searches(
        request.app[POOL],
        None if who.is_admin else who.tenant,
        state,
        decode_cursor(query.get("cursor")),
        limit + 1,
    )
    page = found[:limit]
    last = page[-1] if page else None
    cursor = None
    if last is not None and len(found) > limit:
        cursor = encode_cursor(last["created_at"], last["search_id"])
    return web.json_response(
        {"searches": [search_view(row) for row in page], "next_cursor": cursor, "total": total}
    )


async def _visible(request: web.Request) -> Any:
    """The search's row in the read model (which lags the log by a moment), if the caller may
    see it; else 404."""
    search_id = _search_id(request)
    row = await search_row(request.app[POOL], search_id)
    if row is None or not principal(request).may_see(row["tenant"]):
        raise error(404, "no such search")
    return row


async def _loaded(request: web.Request) -> Search:
    """The search from its stream, if the caller may see it; else 404. From the stream itself,
    not the read model, which may not show a search just submitted: a command on it, or its
    events, right after the submission must find it."""
    search = await request.app[PLANE].searches.load(_search_id(request))
    if search is None or not principal(request).may_see(search.tenant):
        raise error(404, "no such search")
    return search


def _search_id(request: web.Request) -> UUID:
    raw = request.match_info["search_id"]
    return params.uuid(raw, "search_id", status=404, message="no such search")


async def get_search(request: web.Request) -> web.Response:
    row = await _visible(request)
    view = search_view(row)
    view["spec"] = json.loads(row["spec"])
    return web.json_response(view)


async def get_trials(request: web.Request) -> web.Response:
    row = await _visible(request)
    return web.json_response({"trials": await trials(request.app[POOL], row["search_id"])})


async def get_curves(request: web.Request) -> web.Response:
    """Every trial's curve of the search's metric (or `metric`), a page of trials at a time:
    `after` a trial number, at most `limit`, each thinned to about `points` points; `trial`
    (repeated) picks trials. `next_after` continues the page, null at the last."""
    row = await _visible(request)
    query = request.query
    metric = query.get("metric") or row["metric"]
    if not METRIC_NAME.fullmatch(metric):
        raise error(400, "metric must be a metric's name, e.g. loss", field="metric")
    after = params.integer(query.get("after"), "after", minimum=-1)
    limit = params.integer(query.get("limit"), "limit", minimum=1, maximum=MAX_CURVE_TRIALS)
    points = params.integer(query.get("points"), "points", minimum=2, maximum=MAX_CURVE_POINTS)
    chosen = query.getall("trial", [])
    if len(chosen) > MAX_CURVE_TRIALS:
        raise error(400, f"at most {MAX_CURVE_TRIALS} trials at once", field="trial")
    only = [n for raw in chosen if (n := params.integer(raw, "trial")) is not None] or None
    limit = limit or MAX_CURVE_TRIALS
    page = await curves(
        request.app[POOL],
        row["search_id"],
        metric,
        after=-1 if after is None else after,
        only=only,
        limit=limit + 1,
        points=points or CURVE_POINTS,
    )
    more = len(page) > limit
    page = page[:limit]
    response = web.json_response(
        {
            "metric": metric,
            "mode": row["mode"] if metric == row["metric"] else None,
            "trials": page,
            "next_after": page[-1]["number"] if more else None,
        }
    )
    # A thousand curves are a megabyte or two of digits, which gzip shrinks to about a third.
    response.enable_compression()
    return response


async def get_best(request: web.Request) -> web.Response:
    """The best trial so far, and the job manifest that trains its model again (the template,
    its hyperparameters, the whole budget): submit it with POST /v1/jobs."""
    row = await _visible(request)
    if row["best_trial"] is None:
        raise error(404, "no trial has reported its metric yet")
    found = await trials(request.app[POOL], row["search_id"])
    trial = found[row["best_trial"]]
    manifest = best_manifest(row, trial)
    return web.json_response(
        {
            "trial": row["best_trial"],
            "rung": row["best_rung"],
            "metric": {"name": row["metric"], "mode": row["mode"], "value": row["best_metric"]},
            "hparams": trial["hparams"],
            "job_id": trial["job_id"],
            "manifest": manifest.model_dump(mode="json", exclude_defaults=True),
        }
    )


async def cancel(request: web.Request) -> web.Response:
    who = principal(request)
    found = await _loaded(request)
    body = await json_body(request)
    raw = body.get("reason") if isinstance(body, dict) else None
    reason = params.text(raw if isinstance(raw, str) else None, "reason") or "cancelled by user"
    metadata = event_metadata(request, who, found.tenant)
    try:
        search = await request.app[PLANE].searches.cancel(found.search_id, reason, metadata)
    except SearchRefused as exc:
        raise error(404 if exc.not_found else 409, str(exc)) from exc
    except SearchBusy as exc:
        raise error(409, str(exc)) from exc
    return web.json_response({"id": str(search.search_id), "state": search.state})


async def stream_events(request: web.Request) -> web.StreamResponse:
    """SSE of the search's events, each once, in order (`id`: the global position;
    `Last-Event-ID` resumes after it); a heartbeat while idle; it ends after SearchEnded."""
    search = await _loaded(request)
    header = request.headers.get("Last-Event-ID") or request.query.get("after")
    after = params.position(header, "Last-Event-ID") or 0
    stream = search_stream(search.search_id)
    store = request.app[PLANE].store
    response = web.StreamResponse(headers=SSE_HEADERS)
    with await live_stream(request):
        await response.prepare(request)
        try:
            with sse_client("search"):
                read = partial(store.read_stream, stream)
                await follow(request, response, stream, read, _Sender(response, after))
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away; it resumes with Last-Event-ID
    return response


class _Sender:
    """Writes a search's events as SSE, each once, in version order."""

    def __init__(self, response: web.StreamResponse, after_position: int) -> None:
        self._response = response
        self._after = after_position
        self.version = 0
        self.finished = False

    async def send(self, recorded: RecordedEvent) -> None:
        if recorded.stream_version <= self.version or self.finished:
            return
        self.version = recorded.stream_version
        event = SEARCH.event_of(recorded)
        self.finished = isinstance(event, SearchEnded)
        if recorded.position <= self._after:
            return  # delivered before the client reconnected
        payload = {
            "type": event.type_name,
            "version": recorded.stream_version,
            "position": recorded.position,
            "data": event.model_dump(mode="json"),
        }
        await self._response.write(
            f"id: {recorded.position}\nevent: {event.type_name}\n"
            f"data: {json.dumps(payload)}\n\n".encode()
        )
