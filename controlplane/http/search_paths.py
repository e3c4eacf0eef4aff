"""The OpenAPI description of searches (`controlplane.http.searches`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane.http import metrics, pending_paths
from controlplane.http.model_paths import REF, answer, path_param
from controlplane.http.operations import links
from controlplane.http.params import CURSOR_SCHEMA, schema, text_schema
from controlplane.http.streams import SSE_EVENT
from controlplane.searches.spec import SearchSpec
from controlplane.searches.views import CURVE_POINTS, MAX_CURVE_POINTS, MAX_CURVE_TRIALS

SCHEMAS: tuple[type[BaseModel], ...] = (SearchSpec, *pending_paths.SCHEMAS, *metrics.SCHEMAS)
"""The component schemas these routes name; and, until controlplane.http.openapi names them
itself, those of the pending reasons' and the metrics' routes."""

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


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): answer(_REASONS[s], {"$ref": REF + "Error"}) for s in statuses}


_ID = path_param("search_id", "the search's id")
_TIME = {"type": ["string", "null"], "format": "date-time"}
_STATE = {"type": "string", "enum": ["running", "completed", "failed", "cancelled"]}
_SEARCH = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "tenant": {"type": "string"},
        "name": {"type": "string"},
        "state": _STATE,
        "searcher": {"type": "string", "enum": ["random", "grid", "asha", "evolution"]},
        "metric": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "mode": {"enum": ["max", "min"]}},
        },
        "max_trials": {"type": "integer"},
        "trials": {"type": "integer", "description": "trials created so far"},
        "best": {
            "type": ["object", "null"],
            "description": "the best trial at the highest rung any trial reached",
            "properties": {
                "trial": {"type": "integer"},
                "rung": {"type": "integer"},
                "metric": {"type": "number"},
            },
        },
        "reason": {"type": ["string", "null"], "description": "why it ended"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "created_at": _TIME,
        "updated_at": _TIME,
        "ended_at": _TIME,
        "spec": {"$ref": REF + "SearchSpec", "description": "as submitted (GET of one only)"},
    },
}
_TRIAL_STATE = {
    "type": "string",
    "enum": ["running", "paused", "completed", "failed", "pruned", "cancelled"],
}
_TRIAL = {
    "type": "object",
    "properties": {
        "number": {"type": "integer"},
        "job_id": {"type": "string", "description": "the job of its latest rung"},
        "rung": {"type": "integer"},
        "budget": {"type": "integer", "description": "steps or epochs it trains to at its rung"},
        "state": _TRIAL_STATE,
        "hparams": {"type": "object"},
        "results": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"rung": {"type": "integer"}, "metric": {"type": "number"}},
            },
        },
        "metric": {"type": ["number", "null"]},
        "parent": {"type": ["integer", "null"], "description": "mutated from (evolution)"},
        "reason": {"type": "string", "description": "the searcher's latest decision's reason"},
        "created_at": _TIME,
        "updated_at": _TIME,
    },
}

_CURVE = {
    "type": "object",
    "properties": {
        "number": {"type": "integer"},
        "rung": {"type": "integer", "description": "the highest rung it reached"},
        "state": _TRIAL_STATE,
        "jobs": {
            "type": "array",
            "items": {"type": "string"},
            "description": "its jobs, one per rung it reached, rung 0 first",
        },
        "reported": {
            "type": "integer",
            "description": "how many reports of the metric its curve was thinned from",
        },
        "points": {
            "type": "array",
            "description": '[step, value] by step; a non-finite value as a string ("inf")',
            "items": {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": ["number", "string"]}],
                "items": False,
                "minItems": 2,
            },
        },
    },
}
_CURVES_PARAMS: list[dict[str, Any]] = [
    _ID,
    {
        "name": "metric",
        "in": "query",
        "description": "the metric to draw (default: the search's own)",
        "schema": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_.]{0,63}$"},
    },
    {
        "name": "after",
        "in": "query",
        "description": "trials numbered above this one (a page's `next_after`)",
        "schema": schema(minimum=-1),
    },
    {
        "name": "limit",
        "in": "query",
        "description": f"trials in the page (default {MAX_CURVE_TRIALS})",
        "schema": schema(minimum=1, maximum=MAX_CURVE_TRIALS),
    },
    {
        "name": "points",
        "in": "query",
        "description": f"about how many points per curve, evenly thinned (default {CURVE_POINTS})",
        "schema": schema(minimum=2, maximum=MAX_CURVE_POINTS),
    },
    {
        "name": "trial",
        "in": "query",
        "description": "only these trials (repeat it)",
        "schema": {"type": "array", "items": schema(), "maxItems": MAX_CURVE_TRIALS},
        "style": "form",
        "explode": True,
    },
]


def openapi_paths() -> dict[str, Any]:
    secured: list[dict[str, list[str]]] = [{"bearer": []}]
    return {
        "/v1/searches": {
            "post": {
                "operationId": "submitSearch",
                "summary": "Submit a search: its first trials' jobs are submitted at once",
                "security": secured,
                "parameters": [
                    {
                        "name": "tenant",
                        "in": "query",
                        "description": "the tenant it is for (the admin's token only)",
                        "schema": text_schema(),
                    },
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "description": "a retry with the same key finds the same search",
                        "schema": text_schema(min_length=1, max_length=255),
                    },
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": REF + "SearchSpec"}}},
                },
                "responses": {
                    "201": {
                        **answer("the search", _SEARCH),
                        "links": links(
                            "search_id",
                            "getSearch",
                            "getSearchTrials",
                            "getSearchCurves",
                            "getSearchBest",
                            "cancelSearch",
                        ),
                    },
                    **_errors(400, 401, 403, 409, 422, 429),
                },
            },
            "get": {
                "operationId": "listSearches",
                "summary": "The caller's searches (the admin's: everyone's), newest first",
                "security": secured,
                "parameters": [
                    {"name": "state", "in": "query", "schema": _STATE},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 500},
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "description": "the next_cursor of the page before",
                        "schema": CURSOR_SCHEMA,
                    },
                ],
                "responses": {
                    "200": answer(
                        "a page of searches",
                        {
                            "type": "object",
                            "properties": {
                                "searches": {"type": "array", "items": _SEARCH},
                                "next_cursor": {"type": ["string", "null"]},
                                "total": {
                                    "type": "integer",
                                    "description": "how many searches match in all",
                                },
                            },
                        },
                    ),
                    **_errors(400, 401),
                },
            },
        },
        "/v1/searches/{search_id}": {
            "get": {
                "operationId": "getSearch",
                "summary": "A search: its state, its best trial so far, its spec",
                "security": secured,
                "parameters": [_ID],
                "responses": {"200": answer("the search", _SEARCH), **_errors(401, 404)},
            }
        },
        "/v1/searches/{search_id}/trials": {
            "get": {
                "operationId": "getSearchTrials",
                "summary": "Every trial of the search: its rung, metric, state and why",
                "security": secured,
                "parameters": [_ID],
                "responses": {
                    "200": answer(
                        "the trials, by number",
                        {
                            "type": "object",
                            "properties": {"trials": {"type": "array", "items": _TRIAL}},
                        },
                    ),
                    **_errors(401, 404),
                },
            }
        },
        "/v1/searches/{search_id}/curves": {
            "get": {
                "operationId": "getSearchCurves",
                "summary": "Every trial's metric curve, a page of trials at a time, each curve "
                "thinned to a bounded number of points (for a chart of all trials)",
                "security": secured,
                "parameters": _CURVES_PARAMS,
                "responses": {
                    "200": answer(
                        "the trials' curves, by trial number",
                        {
                            "type": "object",
                            "properties": {
                                "metric": {"type": "string"},
                                "mode": {
                                    "type": ["string", "null"],
                                    "enum": ["max", "min", None],
                                    "description": "the search's mode, when it is its metric",
                                },
                                "trials": {"type": "array", "items": _CURVE},
                                "next_after": {
                                    "type": ["integer", "null"],
                                    "description": "`after` for the next page; null: no more",
                                },
                            },
                        },
                    ),
                    **_errors(400, 401, 404),
                },
            }
        },
        "/v1/searches/{search_id}/best": {
            "get": {
                "operationId": "getSearchBest",
                "summary": "The best trial so far, and the job manifest that trains its model "
                "again (submit it with POST /v1/jobs)",
                "security": secured,
                "parameters": [_ID],
                "responses": {
                    "200": answer(
                        "the best trial",
                        {
                            "type": "object",
                            "properties": {
                                "trial": {"type": "integer"},
                                "rung": {"type": "integer"},
                                "metric": {"type": "object"},
                                "hparams": {"type": "object"},
                                "job_id": {"type": "string"},
                                "manifest": {"$ref": REF + "JobManifest"},
                            },
                        },
                    ),
                    **_errors(401, 404),
                },
            }
        },
        "/v1/searches/{search_id}/cancel": {
            "post": {
                "operationId": "cancelSearch",
                "summary": "Cancel a running search: its running trials' jobs are cancelled",
                "security": secured,
                "parameters": [_ID],
                "requestBody": {
                    "required": False,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"reason": {"type": "string", "maxLength": 1000}},
                            }
                        }
                    },
                },
                "responses": {
                    "200": answer(
                        "the cancelled search",
                        {
                            "type": "object",
                            "properties": {"id": {"type": "string"}, "state": _STATE},
                        },
                    ),
                    **_errors(400, 401, 404, 409),
                },
            }
        },
        "/v1/searches/{search_id}/events": {
            "get": {
                "operationId": "streamSearchEvents",
                "summary": "SSE of the search's events (trials created, promoted, finished, "
                "failed, pruned; best updated; ended), each once; Last-Event-ID resumes",
                "security": secured,
                "parameters": [
                    _ID,
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "description": "resume after this position",
                        "schema": {"type": "string"},
                    },
                ],
                "responses": {
                    "200": {
                        "description": "text/event-stream of the search's events",
                        "content": {"text/event-stream": SSE_EVENT},
                    },
                    **_errors(400, 401, 404, 429),
                },
            }
        },
    }
