"""The syntax tree of a search query, as `query.parse` builds it: canonical, so that two queries
that mean the same by construction compare equal (an And never holds an And, an Or never an Or,
neither holds fewer than two terms; phrases have their whitespace collapsed; times are in UTC)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from typing import Any, TypeAlias

FACETS = ("framework", "domain", "tenant", "license")
"""The fields a search counts its matches by."""

EXACT_FIELDS = ("name", *FACETS, "tag")
"""The fields `field:value` matches exactly (`tag`: one of the tags)."""


class Op(StrEnum):
    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


COMPARE: dict[Op, Callable[[Any, Any], Any]] = {
    Op.EQ: operator.eq,
    Op.NE: operator.ne,
    Op.LT: operator.lt,
    Op.LE: operator.le,
    Op.GT: operator.gt,
    Op.GE: operator.ge,
}
"""The comparisons as Python operators: on numbers they decide (the reference evaluation), on
SQLAlchemy columns they build the SQL (the compiler), so both read one table."""


@dataclass(frozen=True, slots=True)
class Word:
    """Free text: every token of `text` occurs in the title, description or tags."""

    text: str


@dataclass(frozen=True, slots=True)
class Phrase:
    """Free text: the tokens of `text` occur in this order, one after the other."""

    text: str


@dataclass(frozen=True, slots=True)
class Exact:
    """`field:value`: the field (one of EXACT_FIELDS) is `value`, case and all."""

    field: str
    value: str


@dataclass(frozen=True, slots=True)
class NameContains:
    """`name~text`: the model's name contains `text`, ignoring case."""

    text: str


@dataclass(frozen=True, slots=True)
class Metric:
    """`metrics.NAME op number`; a version without that metric never matches (not even `!=`)."""

    name: str
    op: Op
    value: float


@dataclass(frozen=True, slots=True)
class Version:
    op: Op
    value: int


@dataclass(frozen=True, slots=True)
class Created:
    """`created op time`: a date stands for its whole UTC day (`created=2026-12-01` is any time
    that day, `created>2026-12-01` from the next day on); a datetime for its microsecond, the
    resolution of Postgres's timestamps and Python's datetimes alike."""

    op: Op
    value: date | datetime

    def span(self) -> tuple[datetime, datetime]:
        """The instants the value stands for: [start, end). Raises OverflowError at the ends of
        the calendar (the parser turns that into a QueryError)."""
        if isinstance(self.value, datetime):
            return self.value, self.value + timedelta(microseconds=1)
        start = datetime.combine(self.value, time(), UTC)
        return start, start + timedelta(days=1)

    def bounds(self) -> tuple[datetime | None, datetime | None, bool]:
        """The comparison as `lower <= created < upper` (None: unbounded), and whether it is
        negated: the one statement of what each operator means on a span."""
        start, end = self.span()
        return {
            Op.LT: (None, start, False),
            Op.LE: (None, end, False),
            Op.GT: (end, None, False),
            Op.GE: (start, None, False),
            Op.EQ: (start, end, False),
            Op.NE: (start, end, True),
        }[self.op]


@dataclass(frozen=True, slots=True)
class Not:
    term: Node


@dataclass(frozen=True, slots=True)
class And:
    """Every term holds; the empty And (the empty query) matches every version."""

    terms: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    terms: tuple[Node, ...]


Leaf: TypeAlias = Word | Phrase | Exact | NameContains | Metric | Version | Created
Node: TypeAlias = Leaf | Not | And | Or
