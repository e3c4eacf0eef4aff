"""Searches over HTTP: submit one (`POST /v1/searches`), list them, read one with its trials,
its trials' metric curves (a page of many trials in one response, for a dashboard's chart)
and its best trial (as a job manifest to run again), cancel one, and follow one's decisions as
they are recorded (SSE). The handlers route and authenticate; the searches feature's facade
(`controlplane.searches.application`) decides."""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Annotated, Any, get_args

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from controlplane.events.records import RecordedEvent
from controlplane.http import params, query
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.jobs import JOBS_APPLICATION
from controlplane.http.keys import IMAGES, PLANE
from controlplane.http.operations import (
    Answer,
    Operation,
    Param,
    add_operations,
    answer,
    links,
)
from controlplane.http.requests import (
    event_metadata,
    idempotency_key,
    idempotency_param,
    json_body,
    validated,
)
from controlplane.http.stream_events import follow
from controlplane.http.streams import SSE_EVENT, SSE_HEADERS, live_stream
from controlplane.instruments import sse_client
from controlplane.jobs.application import MAX_PAGE
from controlplane.searches.application import MAX_REASON, SearchesApplication
from controlplane.searches.events import SearchEnded
from controlplane.searches.lifecycle import SEARCH, State
from controlplane.searches.spec import SearchSpec
from controlplane.searches.streams import search_stream
from controlplane.searches.views import (
    CURVE_POINTS,
    MAX_CURVE_POINTS,
    MAX_CURVE_TRIALS,
    BestTrial,
    CurvePage,
    SearchCancelled,
    SearchCreated,
    SearchDetail,
    SearchPage,
    TrialList,
)

SEARCHES_APPLICATION = web.AppKey("searches_application", SearchesApplication)
STATES = get_args(State)
METRIC_NAME = "^[A-Za-z_][A-Za-z0-9_.]{0,63}$"
"""As a search's metric is named (`searches.spec.Metric`): also what learners may report."""


class SubmitQuery(query.Query):
    tenant: Annotated[str | None, query.text()] = Field(
        default=None, description="the tenant it is for (the admin's token only)"
    )


class ListQuery(query.Query):
    state: Annotated[State | None, query.choice(STATES)] = Field(
        default=None, description="only searches in this state"
    )
    limit: Annotated[int, query.integer(1, MAX_PAGE)] = Field(
        default=50, description="searches per page"
    )
    cursor: Annotated[str | None, query.CURSOR] = Field(
        default=None, description="the next_cursor of the page before"
    )


def _metric(value: Any, name: str) -> str | None:
    # Empty: the search's own metric, as when it is left out.
    if value == "":
        return None
    if not isinstance(value, str) or not re.fullmatch(METRIC_NAME, value):
        raise query.refuse(f"{name} must be a metric's name, e.g. loss")
    return value


class CurvesQuery(query.Query):
    metric: Annotated[
        str | None, query.Parameter(_metric, {"type": "string", "pattern": METRIC_NAME})
    ] = Field(default=None, description="the metric to draw (default: the search's own)")
    after: Annotated[int, query.integer(-1)] = Field(
        default=-1, description="trials numbered above this one (a page's `next_after`)"
    )
    limit: Annotated[int, query.integer(1, MAX_CURVE_TRIALS)] = Field(
        default=MAX_CURVE_TRIALS, description=f"trials in the page (default {MAX_CURVE_TRIALS})"
    )
    points: Annotated[int, query.integer(2, MAX_CURVE_POINTS)] = Field(
        default=CURVE_POINTS,
        description=f"about how many points per curve, evenly thinned (default {CURVE_POINTS})",
    )
    trial: list[Annotated[int, query.integer()]] = Field(
        default=[], max_length=MAX_CURVE_TRIALS, description="only these trials (repeat it)"
    )

    @field_validator("trial", mode="before")
    @classmethod
    def _at_most(cls, chosen: list[str]) -> list[str]:
        if len(chosen) > MAX_CURVE_TRIALS:
            raise query.refuse(f"at most {MAX_CURVE_TRIALS} trials at once")
        return chosen


class SearchCancelRequest(BaseModel):
    # Other fields are ignored, as they always were.
    model_config = ConfigDict(extra="ignore")

    reason: str | None = Field(
        default=None,
        description="why (none, or empty: cancelled by user)",
        json_schema_extra={"maxLength": MAX_REASON},
    )


async def submit(request: web.Request) -> web.Response:
    who = principal(request)
    spec = validated(SearchSpec, await json_body(request))
    asked = query.parsed(request, SubmitQuery)
    tenant = acting_tenant(who, asked.tenant, "submits")
    key = idempotency_key(request)
    view, created = await request.app[SEARCHES_APPLICATION].submit(
        tenant, spec, event_metadata(request, who, tenant), key
    )
    headers = {"Location": f"/v1/searches/{view.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return answer(view, status=201, headers=headers)


async def list_all(request: web.Request) -> web.Response:
    who = principal(request)
    asked = query.parsed(request, ListQuery)
    page = await request.app[SEARCHES_APPLICATION].page(
        who, state=asked.state, cursor=asked.cursor, limit=asked.limit
    )
    return answer(page)


async def get_search(request: web.Request) -> web.Response:
    searches = request.app[SEARCHES_APPLICATION]
    row = await searches.visible(principal(request), request.match_info["search_id"])
    return answer(searches.detail(row))


async def get_trials(request: web.Request) -> web.Response:
    searches = request.app[SEARCHES_APPLICATION]
    row = await searches.visible(principal(request), request.match_info["search_id"])
    return answer(await searches.trials(row))


async def get_curves(request: web.Request) -> web.Response:
    searches = request.app[SEARCHES_APPLICATION]
    row = await searches.visible(principal(request), request.match_info["search_id"])
    asked = query.parsed(request, CurvesQuery)
    page = await searches.curves(
        row,
        metric=asked.metric,
        after=asked.after,
        only=asked.trial,
        limit=asked.limit,
        points=asked.points,
    )
    # Up to a million points: pydantic writes them as JSON far faster than json.dumps their
    # dump (the values are the same).
    response = web.Response(
        text=page.model_dump_json(by_alias=True), content_type="application/json"
    )
    # A thousand curves are a megabyte or two of digits, which gzip shrinks to about a third.
    response.enable_compression()
    return response


async def get_best(request: web.Request) -> web.Response:
    searches = request.app[SEARCHES_APPLICATION]
    row = await searches.visible(principal(request), request.match_info["search_id"])
    return answer(await searches.best(row))


async def cancel(request: web.Request) -> web.Response:
    who = principal(request)
    searches = request.app[SEARCHES_APPLICATION]
    found = await searches.loaded(who, request.match_info["search_id"])
    body = validated(SearchCancelRequest, await json_body(request))
    metadata = event_metadata(request, who, found.tenant)
    return answer(await searches.cancel(found, body.reason, metadata))


async def stream_events(request: web.Request) -> web.StreamResponse:
    """SSE of the search's events, each once, in order (`id`: the global position;
    `Last-Event-ID` resumes after it); a heartbeat while idle; it ends after SearchEnded."""
    search = await request.app[SEARCHES_APPLICATION].loaded(
        principal(request), request.match_info["search_id"]
    )
    after = params.resume_after(request.query, request.headers)
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


SEARCH_ID = Param("search_id", "path", "the search's id", {"type": "string"})
_REASONS = {
    400: "malformed request: a parameter or JSON body (the field names which)",
    401: "missing or wrong token",
    403: "a tenant's token acting for another tenant",
    404: "no such search (or none of the caller's)",
    409: "the search has ended, or an Idempotency-Key was used for another search",
    422: "an invalid search: the field names what is wrong",
    429: "over the tenant's submission rate, queued jobs, CPUs, memory or searches running, or "
    "its live streams (the field names which)",
}


_NOT_READY = (
    "a search submitted a moment ago whose views are still not ready after 5 s (the "
    "projections are behind: /readyz says so); retry after Retry-After"
)


def _errors(*statuses: int, **reasons: str) -> dict[int, str]:
    """Error answers; `e422="..."` says what a status means for one operation."""
    return {s: reasons.get(f"e{s}", _REASONS[s]) for s in statuses}


OPERATIONS = (
    Operation(
        "post",
        "/v1/searches",
        submit,
        "submitSearch",
        "Submit a search: its first trials' jobs are submitted at once",
        {
            201: Answer(
                "the search (also for an idempotent retry)",
                SearchCreated,
                links=links(
                    "search_id",
                    "getSearch",
                    "getSearchTrials",
                    "getSearchCurves",
                    "getSearchBest",
                    "cancelSearch",
                ),
            )
        },
        _errors(
            400,
            401,
            403,
            409,
            422,
            429,
            e403="a tenant's token acting for another tenant; a file:// trial.data.source or "
            "trial.results.location outside the operator's roots for the tenant; or a "
            "trial.webhook_url the service may not send to; or a search that alone asks for "
            "more than its tenant may hold at all (the field names which)",
        ),
        query=SubmitQuery,
        params=(idempotency_param("a retry with the same key finds the same search"),),
        body=SearchSpec,
        body_required=True,
    ),
    Operation(
        "get",
        "/v1/searches",
        list_all,
        "listSearches",
        "The caller's searches (the admin's: everyone's), newest first",
        {200: Answer("a page of searches", SearchPage)},
        _errors(400, 401),
        query=ListQuery,
    ),
    Operation(
        "get",
        "/v1/searches/{search_id}",
        get_search,
        "getSearch",
        "A search: its state, its best trial so far, its spec",
        {200: Answer("the search", SearchDetail)},
        _errors(401, 404, 429, e429=_NOT_READY),
        params=(SEARCH_ID,),
    ),
    Operation(
        "get",
        "/v1/searches/{search_id}/trials",
        get_trials,
        "getSearchTrials",
        "Every trial of the search: its rung, metric, state and why",
        {200: Answer("the trials, by number", TrialList)},
        _errors(401, 404, 429, e429=_NOT_READY),
        params=(SEARCH_ID,),
    ),
    Operation(
        "get",
        "/v1/searches/{search_id}/curves",
        get_curves,
        "getSearchCurves",
        "Every trial's metric curve, a page of trials at a time, each curve thinned to a "
        "bounded number of points (for a chart of all trials)",
        {200: Answer("the trials' curves, by trial number", CurvePage)},
        _errors(400, 401, 404, 429, e429=_NOT_READY),
        query=CurvesQuery,
        params=(SEARCH_ID,),
    ),
    Operation(
        "get",
        "/v1/searches/{search_id}/best",
        get_best,
        "getSearchBest",
        "The best trial so far, and the job manifest that trains its model again (submit it "
        "with POST /v1/jobs)",
        {200: Answer("the best trial", BestTrial)},
        _errors(
            401,
            404,
            429,
            e404="no such search (or none of the caller's), or no trial has "
            "reported its metric yet",
            e429=_NOT_READY,
        ),
        params=(SEARCH_ID,),
    ),
    Operation(
        "post",
        "/v1/searches/{search_id}/cancel",
        cancel,
        "cancelSearch",
        "Cancel a running search: its running trials' jobs are cancelled",
        {200: Answer("the cancelled search", SearchCancelled)},
        _errors(400, 401, 404, 409, 422, e422="invalid fields, each listed (a reason not text)"),
        params=(SEARCH_ID,),
        body=SearchCancelRequest,
    ),
    Operation(
        "get",
        "/v1/searches/{search_id}/events",
        stream_events,
        "streamSearchEvents",
        "SSE of the search's events (trials created, promoted, finished, failed, pruned; best "
        "updated; ended), each once; Last-Event-ID resumes",
        {
            200: Answer(
                "text/event-stream of the search's events",
                SSE_EVENT["schema"],
                media="text/event-stream",
            )
        },
        _errors(400, 401, 404, 429),
        description="Each SSE `id` is the event's global position; send it back as "
        "`Last-Event-ID` to resume exactly after it. A comment heartbeat is sent while idle.",
        query=query.ResumeQuery,
        params=(
            SEARCH_ID,
            Param("Last-Event-ID", "header", "resume after this position", params.POSITION_SCHEMA),
        ),
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
    app.on_startup.append(_open)


async def _open(app: web.Application) -> None:
    # After the jobs facade (whose checks and limits a submission passes) is open: this
    # module's routes are added after the jobs', so its startup runs after theirs.
    plane = app[PLANE]
    app[SEARCHES_APPLICATION] = SearchesApplication(
        plane.searches, app[JOBS_APPLICATION], plane.pool, images=app[IMAGES]
    )
