"""Query, path and header parameters, parsed before any I/O: anything malformed, or out of the
range of the column it is compared with, is a 400 naming the parameter.

Checked here rather than left to the database: a value Postgres refuses (an int4 past
2**31 - 1, a NUL byte in text) fails with a 500, and on a streamed route only after the 200
and its headers were sent, so the client sees a broken response instead of an error.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any, overload
from uuid import UUID

from controlplane.http.errors import error

INT4_MAX = 2**31 - 1
"""The largest `integer` Postgres stores: attempts, learners, page sizes."""
INT8_MAX = 2**63 - 1
"""The largest `bigint`: event positions and log line ids."""

ASCII_INTEGER = re.compile(r"-?[0-9]{1,20}")
"""Plain ASCII digits: `int()` also takes "1_000", " 7 " and digits of other scripts."""
TRUE, FALSE = frozenset({"true", "1"}), frozenset({"false", "0"})


def integer(
    raw: str | None, field: str, *, minimum: int = 0, maximum: int = INT4_MAX
) -> int | None:
    """An integer within [minimum, maximum], or None when the parameter is absent."""
    if raw is None:
        return None
    if not ASCII_INTEGER.fullmatch(raw):
        raise error(400, f"{field} must be an integer", field=field)
    value = int(raw)
    if not minimum <= value <= maximum:
        raise error(400, f"{field} must be between {minimum} and {maximum}", field=field)
    return value


def position(raw: str | None, field: str) -> int | None:
    """A place in a log (an event position or a log line id, both bigint): resume after it."""
    return integer(raw, field, minimum=0, maximum=INT8_MAX)


def resume_after(query: Mapping[str, str], headers: Mapping[str, str]) -> int:
    """Where a stream resumes: after `Last-Event-ID` (a reconnecting EventSource sends it),
    else after `?after=`, else from the start. Both are checked when both are sent, so that a
    malformed `after` is refused whether or not a header happens to come with it."""
    after = position(query.get("after"), "after")
    if "Last-Event-ID" in headers:
        after = position(headers["Last-Event-ID"], "Last-Event-ID")
    return after or 0


def boolean(raw: str | None, field: str, *, default: bool) -> bool:
    """true/1 or false/0 (any case)."""
    if raw is None:
        return default
    value = raw.lower()
    if value not in TRUE | FALSE:
        raise error(400, f"{field} must be true or false", field=field)
    return value in TRUE


def timestamp(raw: str | None, field: str) -> datetime | None:
    """An RFC 3339 instant with its offset, in UTC."""
    if raw is None:
        return None
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise error(400, f"{field} must be an RFC 3339 timestamp", field=field) from None
    if when.tzinfo is None:
        raise error(400, f"{field} needs a time zone offset (e.g. Z)", field=field)
    try:
        # The offset may move an instant near year 1 or 9999 out of what datetime holds.
        return when.astimezone(UTC)
    except OverflowError:
        raise error(400, f"{field} is out of range", field=field) from None


@overload
def text(raw: str, field: str, *, max_length: int = ...) -> str: ...
@overload
def text(raw: str | None, field: str, *, max_length: int = ...) -> str | None: ...
def text(raw: str | None, field: str, *, max_length: int = 1000) -> str | None:
    """Text that Postgres stores and compares: no NUL, valid UTF-8 (percent-decoding and
    header decoding let both through), at most `max_length` characters."""
    if raw is None:
        return None
    if len(raw) > max_length:
        raise error(400, f"{field} must be at most {max_length} characters", field=field)
    if not storable(raw):
        raise error(400, f"{field} must be valid Unicode text without NUL", field=field)
    return raw


def choice(raw: str, field: str, allowed: Collection[str]) -> str:
    if raw not in allowed:
        raise error(400, f"{field} must be one of {', '.join(sorted(allowed))}", field=field)
    return raw


def uuid(raw: str, field: str, *, status: int = 400, message: str | None = None) -> UUID:
    """A UUID; `status` and `message` say what an ill-formed one means (a path id: 404)."""
    try:
        return UUID(raw)
    except ValueError:
        raise error(status, message or f"{field} must be a UUID", field=field) from None


def storable(value: str) -> bool:
    if "\0" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def schema(*, minimum: int = 0, maximum: int = INT4_MAX) -> dict[str, Any]:
    """The OpenAPI schema of an `integer` parameter with these bounds."""
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


POSITION_SCHEMA = schema(maximum=INT8_MAX)

NO_NUL = "^[^\\u0000]*$"
"""The JSON Schema pattern of text that `storable` admits (valid UTF-8 is the transport's)."""


CURSOR = re.compile("[A-Za-z0-9_=-]{1,1000}")
CURSOR_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": 1000,
    "pattern": "^[A-Za-z0-9_=-]+$",
}
"""A page's `next_cursor` sent back: URL-safe base64 of what the server wrote (only one it
gave is taken: one made up is a 400)."""


def text_schema(*, max_length: int = 1000, min_length: int = 0) -> dict[str, Any]:
    """The OpenAPI schema of a parameter read with `text`: what it refuses, the document
    states, so that a request the document allows is not refused."""
    bounds = {"minLength": min_length} if min_length else {}
    return {"type": "string", **bounds, "maxLength": max_length, "pattern": NO_NUL}


def label_filter_schema(max_length: int) -> dict[str, Any]:
    """A `?label=KEY=VALUE` filter read with `text`: a key, then `=`."""
    return {**text_schema(max_length=max_length), "pattern": "^[^=\\u0000]+=[^\\u0000]*$"}
