"""A search query compiled into a SQLAlchemy Core WHERE clause over `schema.model_versions`,
meaning what `reference` says it means (within the limits stated there).

Every value from the query (words, phrases, names, facet values, metric names and numbers,
times) travels as a bound parameter: the SQL text depends only on the query's shape."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import ColumnElement, Double, Table, and_, false, func, literal, or_, true
from sqlalchemy.dialects.postgresql import REGCONFIG

from controlplane.models.query.nodes import (
    COMPARE,
    And,
    Created,
    Exact,
    Metric,
    NameContains,
    Node,
    Not,
    Op,
    Or,
    Phrase,
    Version,
    Word,
)
from controlplane.schema import model_versions

TEXT_SEARCH_CONFIG = "english"
"""The configuration the `search` column's tsvector is built with; queries must use the same."""


def where(node: Node, view: Table = model_versions) -> ColumnElement[bool]:
    match node:
        case Word(text):
            return _text_matches(view, func.plainto_tsquery(_config(), text))
        case Phrase(text):
            return _text_matches(view, func.phraseto_tsquery(_config(), text))
        case Exact("tag", value):
            return view.c.tags.contains([value])
        case Exact("domain", value):
            return view.c.domains.contains([value])
        case Exact(field, value):
            return view.c[field] == value
        case NameContains(text):
            # ILIKE decides, the text's own wildcards escaped (`name~a_b` looks for `a_b`, not
            # `a` any character `b`); the name's trigrams, which a GIN index serves, narrow
            # the names it reads to those that hold every trigram of the text (a text under
            # three characters has none, and narrows nothing).
            return and_(
                view.c.name_trigrams.contains(trigrams(text)),
                view.c.name.ilike(f"%{_escape_like(text)}%", escape="\\"),
            )
        case Metric(name, op, value):
            # A missing metric is NULL here, false in the reference: negations go through
            # `IS NOT true` (below), which treats both alike.
            return _compare(view.c.metrics[name].astext.cast(Double), op, value)
        case Version(op, value):
            return _compare(view.c.version, op, value)
        case Created():
            lower, upper, negated = node.bounds()
            created = view.c.created
            inside = and_(
                true() if lower is None else created >= lower,
                true() if upper is None else created < upper,
            )
            return _negated(inside) if negated else inside
        case Not(term):
            return _negated(where(term, view))
        case And(terms):
            return and_(true(), *(where(term, view) for term in terms))
        case Or(terms):
            return or_(false(), *(where(term, view) for term in terms))


def trigrams(text: str) -> list[str]:
    """Every three characters in a row of `text`, lower-cased, once each, in order; none for a
    text shorter than three (the projection stores a name's alike)."""
    lowered = text.lower()
    return list(dict.fromkeys(lowered[at : at + 3] for at in range(len(lowered) - 2)))


def _config() -> ColumnElement[str]:
    return literal(TEXT_SEARCH_CONFIG, REGCONFIG)


def _text_matches(view: Table, tsquery: ColumnElement[Any]) -> ColumnElement[bool]:
    return view.c.search.bool_op("@@")(tsquery)


def _compare(left: ColumnElement[Any], op: Op, right: float) -> ColumnElement[bool]:
    # The column's operators build SQL from the same Python operators the reference applies
    # (their stubs say Any, since on plain values they return plain values).
    return cast("ColumnElement[bool]", COMPARE[op](left, right))


def _negated(condition: ColumnElement[bool]) -> ColumnElement[bool]:
    """NOT in two-valued logic: SQL's NOT of NULL (a missing metric, facet or text match) is
    NULL, which a WHERE drops, where the reference's `not False` is True."""
    return condition.is_not(true())


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
