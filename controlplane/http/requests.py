"""What every handler reads off a request the same way: its JSON body, and the metadata its
events are recorded with (who acted, for which tenant, under which request id)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from controlplane.events.metadata import Metadata
from controlplane.http import params
from controlplane.http.errors import error, validation_error
from controlplane.http.operations import Param
from controlplane.tenants.principals import Principal

MAX_KEY = 255
"""The longest Idempotency-Key or X-Request-ID."""

M = TypeVar("M", bound=BaseModel)


def actor(who: Principal) -> str:
    return "admin" if who.is_admin else f"tenant:{who.tenant}"


def event_metadata(request: web.Request, who: Principal, tenant: str) -> Metadata:
    """The metadata of the events a request appends for `tenant`; its X-Request-ID, when
    given, correlates them."""
    return Metadata.capture(
        actor(who),
        tenant=tenant,
        correlation_id=params.text(
            request.headers.get("X-Request-ID"), "X-Request-ID", max_length=MAX_KEY
        ),
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# NaN and Infinity are not JSON, though Python's parser takes them: stored in an event they
# would come back as null, and no later read of that event would decode.
_loads = partial(json.loads, parse_constant=_no_constant)


def idempotency_key(request: web.Request) -> str | None:
    """The request's Idempotency-Key (None: not sent); 400 when it is empty or too long."""
    key = params.text(request.headers.get("Idempotency-Key"), "Idempotency-Key", max_length=MAX_KEY)
    if key == "":
        raise error(400, "Idempotency-Key must be 1 to 255 characters", field="Idempotency-Key")
    return key


def idempotency_param(description: str) -> Param:
    """The Idempotency-Key header as an operation declares it: what `idempotency_key` takes."""
    return Param(
        "Idempotency-Key",
        "header",
        description,
        params.text_schema(min_length=1, max_length=MAX_KEY),
    )


async def json_body(request: web.Request) -> Any:
    """The body as parsed JSON ({} when there is none); 400 when it is not JSON, 413 (an Error,
    as every other refusal) when it is over the server's limit."""
    try:
        return await request.json(loads=_loads) if request.can_read_body else {}
    except web.HTTPRequestEntityTooLarge:
        most = request.client_max_size
        raise error(413, f"the body is over {most} bytes, the most this server reads") from None
    except ValueError as exc:
        # JSONDecodeError and UnicodeDecodeError, and a number past Python's limit on digits.
        raise error(400, f"malformed JSON: {exc}") from exc
    except RecursionError:
        raise error(400, "malformed JSON: nested too deeply") from None


def validated(model: type[M], document: Any) -> M:
    """`document` (parsed JSON) as `model`, strictly, as JSON Schema reads the document's
    schemas: a value of another JSON type than its field's is refused, never converted (`false`
    is not 0, nor `"1"` 1); 422 naming every bad field otherwise. Strict in JSON mode, where
    text still reads as the instants, UUIDs and enums the schema says it is; and, as in JSON
    Schema, a number with no fraction is an integer (2.0 where an integer is asked for)."""
    try:
        return model.model_validate_json(json.dumps(document), strict=True)
    except ValidationError as exc:
        if not _integral_floats(document, exc):
            raise validation_error(exc) from exc
    try:
        return model.model_validate_json(json.dumps(document), strict=True)
    except ValidationError as exc:
        raise validation_error(exc) from exc


def _integral_floats(document: Any, exc: ValidationError) -> bool:
    """Each float with no fraction that a field asking for an integer refused, replaced in
    `document` by that integer; whether there was one (then validate again)."""
    replaced = False
    for failure in exc.errors():
        number = failure["input"]
        if failure["type"] != "int_type" or not isinstance(number, float):
            continue
        if not number.is_integer():
            continue
        *path, last = failure["loc"]
        holder = document
        try:
            for step in path:
                if isinstance(holder, dict) and isinstance(step, str) and step not in holder:
                    continue  # a union's tag (searcher.asha.min_budget): no key of the body
                holder = holder[step]
            if holder[last] == number:
                holder[last] = int(number)
                replaced = True
        except (KeyError, IndexError, TypeError):
            continue  # a path the body does not have: the refusal stands
    return replaced
