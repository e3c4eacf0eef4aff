"""One `field op value` term of a search query, checked and typed: the field against the
allowlist, the operator against the field, the value against the field's type."""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime

from controlplane.models.query.errors import QueryError
from controlplane.models.query.nodes import (
    EXACT_FIELDS,
    Created,
    Exact,
    Leaf,
    Metric,
    NameContains,
    Op,
    Version,
)

METRIC_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
"""What may follow `metrics.`: the names the metadata schema admits for metrics."""

MAX_VERSION = 2**31 - 1
"""Versions are Postgres integers; a larger number is a typing error, not a version."""

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATETIME = re.compile(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?(?:Z|[+-]\d{2}:\d{2})?"
)
_COMPARED = ("version", "created", "metrics.NAME")


def term(field: str, op: str, value: str, at: int, value_at: int) -> Leaf:
    """The leaf for `field op value`, the field written at `at` and the value at `value_at`."""
    op_at = at + len(field)
    if op == "~":
        if field != "name":
            raise QueryError(f"only name takes '~' (a partial match), not {field}", op_at)
        return NameContains(value)
    if field in EXACT_FIELDS:
        if op != ":":
            raise QueryError(f"{field} is matched exactly with ':', as in {field}:VALUE", op_at)
        return Exact(field, value)
    if field not in ("version", "created") and not field.startswith("metrics."):
        known = ", ".join((*EXACT_FIELDS, *_COMPARED))
        raise QueryError(f"unknown field {field!r}; the fields are {known}", at)
    if op == ":":
        raise QueryError(f"{field} is compared with = != < <= > >=, as in {field}>=VALUE", op_at)
    if field == "version":
        return Version(Op(op), _version(value, value_at))
    if field == "created":
        return _created(Op(op), value, value_at)
    name = field.removeprefix("metrics.")
    if not METRIC_NAME.fullmatch(name):
        raise QueryError(
            f"{name!r} is not a metric name: a letter, then letters, digits and _, "
            "64 characters at most",
            at + len("metrics."),
        )
    return Metric(name, Op(op), _number(value, value_at))


def _number(value: str, at: int) -> float:
    if not _NUMBER.fullmatch(value):
        raise QueryError(f"{value!r} is not a number", at)
    number = float(value)
    if not math.isfinite(number):
        raise QueryError(f"{value} is too large a number", at)
    return number


def _version(value: str, at: int) -> int:
    if not value.isascii() or not value.isdigit() or int(value) > MAX_VERSION:
        raise QueryError(f"{value!r} is not a version (a whole number up to {MAX_VERSION})", at)
    return int(value)


def _created(op: Op, value: str, at: int) -> Created:
    try:
        if _DATE.fullmatch(value):
            created = Created(op, date.fromisoformat(value))
        elif _DATETIME.fullmatch(value):
            moment = datetime.fromisoformat(value)
            # A time without an offset is UTC, like the dates; stored in UTC, so that the same
            # instant written two ways is one and the same tree.
            moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
            created = Created(op, moment.astimezone(UTC))
        else:
            raise ValueError(value)
        created.span()
    except ValueError:
        raise QueryError(
            f"{value!r} is not an ISO-8601 date (2026-12-01) or time (2026-12-01T10:30:00Z)", at
        ) from None
    except OverflowError:
        raise QueryError(f"{value} is too close to the ends of years 1 to 9999", at) from None
    return created
