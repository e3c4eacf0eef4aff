"""Hypothesis strategies for search syntax trees: canonical ones (what `parse` builds, within its
bounds) for round trips, and trees whose values are any text at all for the SQL's parameters."""

from __future__ import annotations

from datetime import UTC, date, datetime

from hypothesis import strategies as st

from controlplane.models.query.errors import QueryError
from controlplane.models.query.nodes import (
    EXACT_FIELDS,
    And,
    Created,
    Exact,
    Leaf,
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
from controlplane.models.query.query import MAX_DEPTH, MAX_TERMS, joined, parse
from controlplane.models.query.terms import MAX_VERSION, METRIC_NAME

_PRINTABLE = st.characters(blacklist_categories=("Cc", "Cs"))


def _reads_as(text: str, node: Node) -> bool:
    try:
        return parse(text) == node
    except QueryError:
        return False


_typed = (
    st.builds(
        Metric,
        st.from_regex(METRIC_NAME, fullmatch=True),
        st.sampled_from(Op),
        st.floats(allow_nan=False, allow_infinity=False),
    ),
    st.builds(Version, st.sampled_from(Op), st.integers(0, MAX_VERSION)),
    st.builds(
        Created,
        st.sampled_from(Op),
        st.dates(max_value=date(9999, 12, 30))
        | st.datetimes(
            min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
        ),
    ),
)
_quotable = st.text(_PRINTABLE.filter(lambda c: c != '"'), min_size=1, max_size=12)

canonical_leaves: st.SearchStrategy[Leaf] = st.one_of(
    st.text(_PRINTABLE, min_size=1, max_size=12).map(Word).filter(lambda w: _reads_as(w.text, w)),
    _quotable.map(lambda text: " ".join(text.split())).filter(bool).map(Phrase),
    st.builds(Exact, st.sampled_from(EXACT_FIELDS), _quotable),
    st.builds(NameContains, _quotable),
    *_typed,
)
"""Leaves as the parser builds them: words it reads as words, phrases with their whitespace
collapsed, values without a quote."""

hostile_leaves: st.SearchStrategy[Leaf] = st.one_of(
    st.builds(Word, st.text(min_size=1)),
    st.builds(Phrase, st.text(min_size=1)),
    st.builds(Exact, st.sampled_from(EXACT_FIELDS), st.text(min_size=1)),
    st.builds(NameContains, st.text(min_size=1)),
    *_typed,
)
"""Leaves with any text for values: quotes, backslashes, LIKE's wildcards, NUL, SQL."""


def trees(leaves: st.SearchStrategy[Leaf]) -> st.SearchStrategy[Node]:
    """Canonical trees over `leaves` that `parse` admits: flattened, within the bounds."""
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            children.filter(lambda c: not isinstance(c, Not)).map(Not),
            st.lists(children, min_size=2, max_size=3).map(lambda terms: joined(And, terms)),
            st.lists(children, min_size=2, max_size=3).map(lambda terms: joined(Or, terms)),
        ),
        max_leaves=MAX_TERMS // 4,
    ).filter(lambda tree: depth(tree) <= MAX_DEPTH)


def depth(node: Node) -> int:
    """The nesting of parentheses and negations the parser meets in `canonical(node)`."""
    match node:
        case Not(term):
            return 1 + depth(term) + isinstance(term, And | Or)
        case And(terms):
            return max(depth(term) + isinstance(term, Or) for term in terms)
        case Or(terms):
            return max(depth(term) for term in terms)
        case _:
            return 0
