"""The search language: what it reads, what it refuses and where, its bounds, and that the
canonical printer writes what it reads back."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from hypothesis import given

from controlplane.models.query.errors import QueryError
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
from controlplane.models.query.query import MAX_DEPTH, MAX_LENGTH, MAX_TERMS, canonical, parse
from tests.controlplane.models.query.trees import canonical_leaves, trees

a, b, c = Word("a"), Word("b"), Word("c")


@pytest.mark.parametrize(
    ("query", "tree"),
    [
        ("", And(())),
        ("   ", And(())),
        ("resnet", Word("resnet")),
        ("ResNet-50", Word("ResNet-50")),
        ('"image   classification "', Phrase("image classification")),
        ("name~resn", NameContains("resn")),
        ("name:resnet50", Exact("name", "resnet50")),
        ("framework:pytorch", Exact("framework", "pytorch")),
        ("license:MIT", Exact("license", "MIT")),
        ('tag:"image classification"', Exact("tag", "image classification")),
        ("tenant:OR", Exact("tenant", "OR")),
        ("domain:-x", Exact("domain", "-x")),
        ("metrics.accuracy>=0.9", Metric("accuracy", Op.GE, 0.9)),
        ("metrics.loss<2e-1", Metric("loss", Op.LT, 0.2)),
        ("metrics.delta!=-1", Metric("delta", Op.NE, -1.0)),
        ("metrics.top_1=.5", Metric("top_1", Op.EQ, 0.5)),
        ("version>=3", Version(Op.GE, 3)),
        ('version<="12"', Version(Op.LE, 12)),
        ("created<2026-12-01", Created(Op.LT, date(2026, 12, 1))),
        ("created>2026-12-01T10:30", Created(Op.GT, datetime(2026, 12, 1, 10, 30, tzinfo=UTC))),
        (
            "created=2026-12-01T10:30:00.5+02:00",
            Created(Op.EQ, datetime(2026, 12, 1, 8, 30, 0, 500000, tzinfo=UTC)),
        ),
        ("a b c", And((a, b, c))),
        ("a AND b", And((a, b))),
        ("a (b c)", And((a, b, c))),
        ("a OR b OR c", Or((a, b, c))),
        ("a b OR c", Or((And((a, b)), c))),
        ("a (b OR c)", And((a, Or((b, c))))),
        ("(a OR b) OR c", Or((a, b, c))),
        ("-a", Not(a)),
        ("NOT a b", And((Not(a), b))),
        ("--a", Not(Not(a))),
        ("-(a OR b)", Not(Or((a, b)))),
        ("a-b or c", And((Word("a-b"), Word("or"), c))),
        ('a"b c"', And((a, Phrase("b c")))),
        ("(a)(b)", And((a, b))),
        ("\ta\nb\r", And((a, b))),
    ],
)
def test_the_parser_reads(query: str, tree: Node) -> None:
    assert parse(query) == tree


@pytest.mark.parametrize(
    ("query", "position", "reason"),
    [
        ("a OR", 2, "OR needs a term after it"),
        ("OR a", 0, "OR needs a term before it"),
        ("a AND", 2, "AND needs a term after it"),
        ("(AND a)", 1, "AND needs a term before it"),
        ("NOT", 0, "NOT needs a term after it"),
        ("a -OR b", 2, "- needs a term after it"),
        ("- a", 0, "'-' must be followed, without a space, by a term"),
        ("(a -)", 3, "'-' must be followed"),
        ("a ()", 2, "empty parentheses"),
        ("a (b", 2, "'(' is never closed"),
        ("(", 0, "'(' is never closed"),
        ("a) b", 1, "')' without a matching '('"),
        (")", 0, "')' without a matching '('"),
        ('a "b', 2, "a quote is never closed"),
        ('" "', 0, "empty phrase"),
        ("tag:", 4, "tag: needs a value"),
        ('tag:""', 4, "tag: needs a value"),
        ("x http://example.com", 2, "unknown field 'http'"),
        ("size>3", 0, "unknown field 'size'"),
        ("version >= 3", 8, "write a comparison without spaces"),
        ("metrics.acc =1", 12, "write a comparison without spaces"),
        ("framework=pytorch", 9, "framework is matched exactly with ':'"),
        ("version:3", 7, "version is compared with = != < <= > >="),
        ("tag~res", 3, "only name takes '~'"),
        ("metrics.>1", 8, "'' is not a metric name"),
        ("metrics.val.loss<1", 8, "'val.loss' is not a metric name"),
        ("metrics." + "a" * 65 + ">1", 8, "is not a metric name"),
        ("metrics.acc>=high", 13, "'high' is not a number"),
        ("metrics.acc>=nan", 13, "'nan' is not a number"),
        ("metrics.acc>=inf", 13, "'inf' is not a number"),
        ("metrics.acc>=1e999", 13, "1e999 is too large a number"),
        ("version>=-1", 9, "is not a version"),
        ("version>=1.5", 9, "is not a version"),
        ("version>=٣", 9, "is not a version"),
        ("version>=2147483648", 9, "is not a version"),
        ("created<2026-13-01", 8, "is not an ISO-8601 date"),
        ("created<20261201", 8, "is not an ISO-8601 date"),
        ("created<2026-W01", 8, "is not an ISO-8601 date"),
        ("created<yesterday", 8, "is not an ISO-8601 date"),
        ("created<9999-12-31", 8, "too close to the ends"),
        ("created>0001-01-01T00:00+01:00", 8, "too close to the ends"),
        ("a\x00b", 1, "control character U+0000"),
        ("a \x1b[31m", 2, "control character U+001B"),
        ("a \ud800", 2, "control character U+D800"),
    ],
)
def test_the_parser_refuses_with_the_position_and_the_reason(
    query: str, position: int, reason: str
) -> None:
    with pytest.raises(QueryError) as refused:
        parse(query)
    assert (refused.value.position, reason in refused.value.reason) == (position, True)
    assert str(refused.value).endswith(f"(at column {position + 1})")


def test_a_query_is_bounded_in_length_terms_and_depth() -> None:
    assert parse("a" * MAX_LENGTH) == Word("a" * MAX_LENGTH)
    with pytest.raises(QueryError, match="at most 1000 characters") as long:
        parse("a" * (MAX_LENGTH + 1))
    assert long.value.position == MAX_LENGTH

    many = " ".join(f"w{i}" for i in range(MAX_TERMS))
    assert parse(many) == And(tuple(Word(f"w{i}") for i in range(MAX_TERMS)))
    with pytest.raises(QueryError, match="at most 32 terms") as terms:
        parse(many + " extra")
    assert terms.value.position == len(many) + 1

    assert parse("(" * MAX_DEPTH + "a" + ")" * MAX_DEPTH) == a
    with pytest.raises(QueryError, match="more than 8 nested") as deep:
        parse("(" * MAX_DEPTH + "-a" + ")" * MAX_DEPTH)
    assert deep.value.position == MAX_DEPTH
    # Negations nest too: the parser recurses through them, and a long chain must not reach
    # Python's recursion limit.
    with pytest.raises(QueryError, match="more than 8 nested"):
        parse("-" * (MAX_LENGTH - 1) + "a")


def test_a_date_is_its_whole_utc_day_and_a_time_its_microsecond() -> None:
    day = datetime(2026, 12, 1, tzinfo=UTC)
    next_day = day + timedelta(days=1)
    created = Created(Op.LT, date(2026, 12, 1))
    assert created.span() == (day, next_day)
    assert [Created(op, date(2026, 12, 1)).bounds() for op in Op] == [
        (day, next_day, False),  # =
        (day, next_day, True),  # !=
        (None, day, False),  # <
        (None, next_day, False),  # <=
        (next_day, None, False),  # >
        (day, None, False),  # >=
    ]
    moment = datetime(2026, 12, 1, 10, 30, tzinfo=timezone(timedelta(hours=2)))
    assert Created(Op.LE, moment).bounds() == (None, moment + timedelta(microseconds=1), False)


@pytest.mark.parametrize(
    ("query", "written"),
    [
        ("a AND (b OR c)", "a (b OR c)"),
        ("NOT a", "-a"),
        ('tag:"x y" tag:"z"', 'tag:"x y" tag:z'),
        ("created<2026-12-01T10:30Z", "created<2026-12-01T10:30:00+00:00"),
        ("metrics.a>=1 metrics.b<1e20", "metrics.a>=1.0 metrics.b<1e+20"),
        ("-(a b) OR c", "-(a b) OR c"),
    ],
)
def test_the_canonical_form(query: str, written: str) -> None:
    assert canonical(parse(query)) == written


@given(trees(canonical_leaves))
def test_the_canonical_form_reads_back_as_the_same_tree(tree: Node) -> None:
    assert parse(canonical(tree)) == tree
