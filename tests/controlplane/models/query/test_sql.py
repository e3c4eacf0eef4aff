"""The search compiled for Postgres: user input only ever as bound parameters. (Its meaning is
held to the reference against a real Postgres once the model projection provides the view.)"""

from __future__ import annotations

from datetime import date

import pytest
from hypothesis import given
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.compiler import SQLCompiler

from controlplane.models.query.nodes import (
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
from controlplane.models.query.query import parse
from controlplane.models.query.sql import where
from tests.controlplane.models.query.trees import hostile_leaves, trees

HOSTILE = [
    "O'Brien",
    "'; DROP TABLE events; --",
    'back\\slash \\" quote',
    "100%_sure",
    "$1 %(name_1)s :param ?",
    "\x00nul",
    "E'\\x27'",
    "$$dollar$$ $tag$",
]


def compiled(node: Node) -> SQLCompiler:
    sql = where(node).compile(dialect=postgresql.dialect())
    assert isinstance(sql, SQLCompiler)
    return sql


def _blanked(node: Node) -> Node:
    """The same tree with every value replaced by a fixed one of its type."""
    match node:
        case Word():
            return Word("x")
        case Phrase():
            return Phrase("x")
        case NameContains():
            return NameContains("x")
        case Exact(field):
            return Exact(field, "x")
        case Metric(_, op):
            return Metric("x", op, 0.0)
        case Version(op):
            return Version(op, 0)
        case Created(op):
            return Created(op, date(2000, 1, 1))
        case Not(term):
            return Not(_blanked(term))
        case And(terms):
            return And(tuple(_blanked(term) for term in terms))
        case Or(terms):
            return Or(tuple(_blanked(term) for term in terms))


def _texts(node: Node) -> list[str]:
    """The texts the tree's values travel as parameters as they are (a name match's, escaped:
    see test_a_name_match_escapes_like_wildcards)."""
    match node:
        case Word(text) | Phrase(text) | Exact(_, text) | Metric(text):
            return [text]
        case Not(term):
            return _texts(term)
        case And(terms) | Or(terms):
            return [text for term in terms for text in _texts(term)]
        case _:
            return []


@given(trees(hostile_leaves))
def test_the_sql_text_depends_only_on_the_querys_shape(tree: Node) -> None:
    sql = compiled(tree)
    assert sql.string == compiled(_blanked(tree)).string
    params = [
        p for value in sql.params.values() for p in (value if isinstance(value, list) else [value])
    ]
    for text in _texts(tree):
        assert any(text in str(param) for param in params)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_values_travel_only_as_parameters(hostile: str) -> None:
    tree = Or(
        (
            Word(hostile),
            Phrase(hostile),
            Exact("license", hostile),
            Exact("tag", hostile),
            NameContains(hostile),
            Not(Metric(hostile, Op.NE, 1.0)),
        )
    )
    sql = compiled(tree)
    assert hostile not in sql.string
    values = list(sql.params.values())
    assert (values.count(hostile), values.count([hostile])) == (4, 1)


def test_a_name_match_escapes_like_wildcards() -> None:
    sql = compiled(parse(r"name~a%b_c\d"))
    assert "ILIKE" in sql.string and "ESCAPE '\\'" in sql.string
    # The trigrams narrow (unescaped: they are compared as they are), ILIKE decides.
    assert list(sql.params.values()) == [
        ["a%b", "%b_", "b_c", "_c\\", "c\\d"],
        r"%a\%b\_c\\d%",
    ]


TS = "TIMESTAMP WITH TIME ZONE"


@pytest.mark.parametrize(
    ("query", "sql"),
    [
        ("", "true"),
        ("a", "search @@ plainto_tsquery(%(param_1)s::REGCONFIG, %(plainto_tsquery_1)s::VARCHAR)"),
        (
            '"a b"',
            "search @@ phraseto_tsquery(%(param_1)s::REGCONFIG, %(phraseto_tsquery_1)s::VARCHAR)",
        ),
        ("tag:a", "tags @> %(tags_1)s::TEXT[]"),
        ("domain:a", "domains @> %(domains_1)s::TEXT[]"),
        (
            "metrics.acc>=0.9",
            "CAST((metrics ->> %(metrics_1)s::TEXT) AS DOUBLE PRECISION) >= %(param_1)s",
        ),
        ("version<3", "version < %(version_1)s::INTEGER"),
        ("created>2026-01-01", f"created >= %(created_1)s::{TS}"),
        ("created=2026-01-01", f"created >= %(created_1)s::{TS} AND created < %(created_2)s::{TS}"),
        # Negation is two-valued: a missing value (NULL) is not a match, so its negation is.
        ("-license:a", "(license = %(license_1)s::VARCHAR) IS NOT true"),
        (
            "created!=2026-01-01",
            f"(created >= %(created_1)s::{TS} AND created < %(created_2)s::{TS}) IS NOT true",
        ),
        (
            "-(license:a OR version=1) tenant:t",
            "(license = %(license_1)s::VARCHAR OR version = %(version_1)s::INTEGER) IS NOT true "
            "AND tenant = %(tenant_1)s::VARCHAR",
        ),
    ],
)
def test_the_sql_of_each_term(query: str, sql: str) -> None:
    assert compiled(parse(query)).string.replace("model_versions.", "") == sql
