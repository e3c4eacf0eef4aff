"""JSON error responses: a message, the HTTP status, and the offending fields where known."""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import ValidationError

from controlplane.refusals import Refusal, Refused


def error(
    status: int, message: str, *, field: str | None = None, retry_after_s: float | None = None
) -> web.HTTPException:
    """An exception to raise from a handler; aiohttp sends it as the response. `retry_after_s`
    becomes a Retry-After header (whole seconds, at least 1)."""
    body: dict[str, Any] = {"error": message, "status": status}
    if field is not None:
        body["field"] = field
    headers = None
    if retry_after_s is not None:
        headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))}
    return _CLASSES[status](text=json.dumps(body), content_type="application/json", headers=headers)


STATUS: dict[Refused, int] = {
    Refused.MALFORMED: 400,
    Refused.FORBIDDEN: 403,
    Refused.NOT_FOUND: 404,
    Refused.CONFLICT: 409,
    Refused.INVALID: 422,
    Refused.LIMITED: 429,
    Refused.TOO_LARGE: 413,
}
"""The HTTP status of each kind of refusal a facade raises."""


def refused(refusal: Refusal) -> web.HTTPException:
    """The error response that says `refusal`."""
    if refusal.fields:
        return invalid_fields(list(refusal.fields), refusal.message)
    return error(
        STATUS[refusal.kind],
        refusal.message,
        field=refusal.field,
        retry_after_s=refusal.retry_after_s,
    )


@web.middleware
async def refusal_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A facade's refusal as its error response: handlers route, the facades decide."""
    try:
        return await handler(request)
    except Refusal as exc:
        raise refused(exc) from exc


def validation_error(exc: ValidationError) -> web.HTTPException:
    """422 listing every offending field with its message."""
    return invalid_fields([(_field(err["loc"]), err["msg"]) for err in exc.errors()])


def invalid_fields(fields: list[tuple[str, str]], message: str | None = None) -> web.HTTPException:
    """422 listing every offending field (its name, and what is wrong with it)."""
    body = {
        "error": message or f"{len(fields)} invalid field(s)",
        "status": 422,
        "fields": [{"field": field, "message": why} for field, why in fields],
    }
    return web.HTTPUnprocessableEntity(text=json.dumps(body), content_type="application/json")


def _field(loc: tuple[int | str, ...]) -> str:
    # A refused key of a mapping is named by the key (`env.LD_PRELOAD`): pydantic adds a
    # "[key]" step to tell it from the key's value, which only says the same thing less clearly.
    if loc and loc[-1] == "[key]":
        loc = loc[:-1]
    return ".".join(str(p) for p in loc) or "(body)"


class _ContentTooLarge(web.HTTPClientError):
    """413 with our JSON body: aiohttp's own class insists on a text of its making."""

    status_code = 413


_CLASSES: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest,
    401: web.HTTPUnauthorized,
    403: web.HTTPForbidden,
    404: web.HTTPNotFound,
    409: web.HTTPConflict,
    413: _ContentTooLarge,
    415: web.HTTPUnsupportedMediaType,
    422: web.HTTPUnprocessableEntity,
    429: web.HTTPTooManyRequests,
    503: web.HTTPServiceUnavailable,
}
