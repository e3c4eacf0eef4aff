"""The rules between fields that the document states in words (descriptions), which JSON Schema
cannot: `trainyard bench contract` makes each valid case it generates keep them, as a client
reading the document would (bench/api_contract_hooks.py), so that the server refusing one of
these cases is a real disagreement, not schemathesis's ignorance of a rule.

Each function takes a request body as schemathesis generated it (already valid against the
schema) and changes it in place as little as the rule needs. A rule the schema can state is
stated there, never repaired here.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from controlplane.inference.spec import MAX_ITEM_ELEMENTS
from controlplane.jobs.manifest import MAX_ENV_VALUE_CHARS, MAX_SECRET_ENV_BYTES
from controlplane.logs.search import MAX_PATTERN
from controlplane.searches.space import MAX_BOUND, Space, grid_size, max_point_chars
from controlplane.searches.spec import MAX_TRIALS

ASHA_BUDGET_FLOOR = 1
"""ASHA's min_budget is at least 1, and less than budget.max."""
SMALL_SPACE = {"params": {"x": {"type": "uniform", "low": 0.0, "high": 1.0}}}


def search(body: dict[str, Any]) -> None:
    """POST /v1/searches: a range's low is below its high (an int's at most), a repeat's min
    at most its max, evolution's sample at most its population, ASHA's min_budget below
    budget.max, a grid of at most MAX_TRIALS points, a point a learner can be given."""
    params = body["space"]["params"]
    for param in params.values():
        _ordered(param)
        for inner in param.get("item", {}).values() if param.get("type") == "repeat" else ():
            _ordered(inner)
    searcher = body.get("searcher", {})
    match searcher.get("name"):
        case "evolution" if searcher.get("sample", 5) > searcher.get("population", 20):
            searcher["sample"], searcher["population"] = (
                searcher.get("population", 20),
                searcher.get("sample", 5),
            )
        case "asha" if searcher["min_budget"] >= body["budget"]["max"]:
            body["budget"]["max"] = max(body["budget"]["max"], ASHA_BUDGET_FLOOR + 1)
            searcher["min_budget"] = body["budget"]["max"] - 1
    # The sizes are the server's own arithmetic over the space (the rules: a grid of at most
    # MAX_TRIALS points, a point of at most MAX_ENV_VALUE_CHARS characters as JSON).
    space = Space.model_validate(body["space"])
    too_many = searcher.get("name") == "grid" and (
        grid_size(space, int(searcher.get("points", 3))) > MAX_TRIALS
    )
    if too_many or max_point_chars(space) > MAX_ENV_VALUE_CHARS:
        body["space"] = SMALL_SPACE


def _ordered(param: dict[str, Any]) -> None:
    match param.get("type"):
        case "uniform" | "log_uniform":
            low, high = sorted((param["low"], param["high"]))
            if low == high:
                # Strictly below: the next float up for high, or down for low at the top.
                if high < MAX_BOUND:
                    high = math.nextafter(high, math.inf)
                else:
                    low = math.nextafter(low, -math.inf)
            param["low"], param["high"] = low, high
        case "int":
            param["low"], param["high"] = sorted((param["low"], param["high"]))
        case "repeat":
            param["min"], param["max"] = sorted((param["min"], param["max"]))


def inference(body: dict[str, Any]) -> None:
    """POST /v1/inference: a generated item holds at most MAX_ITEM_ELEMENTS numbers (the
    shape's product); `queries` at most the batches the items given make."""
    source = body.get("input", {})
    shape = (source.get("generate") or {}).get("shape")
    if shape:
        while math.prod(shape) > MAX_ITEM_ELEMENTS:
            largest = shape.index(max(shape))
            shape[largest] = max(1, shape[largest] // 2)
    items = source.get("items")
    if items and body.get("queries") is not None:
        batches = math.ceil(len(items) / body.get("batch_size", 16))
        body["queries"] = min(body["queries"], batches)


def pending_window(query: dict[str, Any]) -> None:
    """GET /v1/jobs/{job_id}/pending: `until` is not before `since` (the 400 it documents)."""
    since, until = query.get("since"), query.get("until")
    if isinstance(since, str) and isinstance(until, str):
        try:
            if _instant(until) < _instant(since):
                query["since"], query["until"] = until, since
        except (ValueError, TypeError):
            return  # not two comparable instants: the server's answer is the schema's


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.upper())  # RFC 3339 allows a lower-case t and z


_SHA256 = re.compile(r"[0-9a-f]{64}")

_ASCII_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
"""What a Postgres regular expression may read as an operator: written `\\c`, it is `c`."""


def log_search(query: dict[str, Any]) -> None:
    """GET /v1/logs/search: with regex=true the pattern is a regular expression in Postgres's
    syntax; a valid case's text is made one that matches itself (its ASCII punctuation
    escaped; other characters are literal), as long as the pattern may be."""
    pattern = query.get("pattern")
    if str(query.get("regex")).lower() not in ("true", "1") or not isinstance(pattern, str):
        return
    while len(escaped := _ASCII_PUNCTUATION.sub(r"\\\1", pattern)) > MAX_PATTERN:
        pattern = pattern[:-1]
    query["pattern"] = escaped


def upload(body: dict[str, Any]) -> None:
    """POST /v1/models/{name}/versions, an upload: the publication's sha256, when given, is the
    artifact part's (the upload is refused if its bytes differ, as documented). Schemathesis
    writes a binary part's bytes only as it sends them, so a well-formed sha256 is left out
    (it is optional) rather than matched; applied as the body is generated, valid or not, it
    leaves an invalid sha256 as it is, so that an invalid body stays invalid."""
    publication = body.get("publication")
    if not isinstance(publication, dict):
        return
    given = publication.get("sha256")
    if isinstance(given, str) and _SHA256.fullmatch(given):
        del publication["sha256"]


def job(body: dict[str, Any]) -> None:
    """POST /v1/jobs: no name in both env and secret_env, and the secrets at most
    MAX_SECRET_ENV_BYTES together as UTF-8 (both in secret_env's description)."""
    secrets, env = body.get("secret_env"), body.get("env")
    if not isinstance(secrets, dict):
        return
    if isinstance(env, dict):
        for name in secrets.keys() & env.keys():
            del env[name]
    while sum(len(f"{k}{v}".encode(errors="replace")) for k, v in secrets.items()) > (
        MAX_SECRET_ENV_BYTES
    ):
        secrets.popitem()


def search_trial(body: dict[str, Any]) -> None:
    """POST /v1/searches: the search's rules, and its trial template's as a job's."""
    search(body)
    if isinstance(body.get("trial"), dict):
        job(body["trial"])
