"""The model search language, one for the API's `q` parameter and `trainyard models search`:
`parse` turns a query into a syntax tree (`nodes`), `canonical` writes a tree back as a query.

Terms:

    resnet                    free text: the word occurs in the title, description or tags
    "image classification"    free text: these words, in this order
    name~resn                 the model's name contains `resn`, ignoring case
    name:resnet50             the model's name is exactly `resnet50`
    framework:pytorch         exact facets: framework, domain, tenant, license, and tag (one
    domain:vision             of the tags); case counts; quote values with spaces:
    license:MIT tag:resnet    tag:"image classification"
    metrics.accuracy>=0.9     a metric compared with a number: = != < <= > >=
    version>=3                the version number, compared likewise
    created<2026-12-01        the publication time: a date is its whole UTC day, a time
    created>=2026-12-01T10:30:00Z  (ISO-8601, UTC without an offset) its microsecond

Combining them: terms side by side must all hold (AND, which may also be written); `OR` between
two terms needs either; `-term` or `NOT term` excludes; parentheses group. NOT binds tightest,
then AND, then OR: `a b OR c` is `(a b) OR c`. The operators are upper case; a lower-case `or`
is a word. The empty query matches every version.

    resnet framework:pytorch metrics.accuracy>=0.9
    name~bert (domain:nlp OR domain:speech) -license:GPL-3.0
    "object detection" created>=2026-01-01 NOT tag:deprecated

A word that looks like a field (`word:`, `word=`, ...) must name one: quote it to search for
the text (`"http://example.com"`); a comparison has no spaces. Quotes cannot hold a quote. A
version without the metric a comparison names never matches it, not even with `!=` (but does
match its negation).

Hostile input is bounded: at most MAX_LENGTH characters, MAX_TERMS terms and MAX_DEPTH nested
parentheses and negations; no control characters; numbers finite. Every refusal is a
QueryError with the position of the problem.
"""

from __future__ import annotations

import re

from controlplane.models.query.errors import QueryError
from controlplane.models.query.nodes import (
    And,
    Created,
    Exact,
    Metric,
    NameContains,
    Node,
    Not,
    Or,
    Phrase,
    Version,
    Word,
)
from controlplane.models.query.tokens import Kind, Symbol, Term, Token, tokenize

MAX_LENGTH = 1000
MAX_TERMS = 32
MAX_DEPTH = 8


def parse(query: str) -> Node:
    """The query's syntax tree; a QueryError if it is not a query."""
    if len(query) > MAX_LENGTH:
        raise QueryError(f"a query is at most {MAX_LENGTH} characters long", MAX_LENGTH)
    tokens = tokenize(query)
    terms = [token for token in tokens if isinstance(token, Term)]
    if len(terms) > MAX_TERMS:
        raise QueryError(f"a query has at most {MAX_TERMS} terms", terms[MAX_TERMS].position)
    return _Parser(tokens, len(query)).query()


class _Parser:
    """Recursive descent over the grammar

        query       = [disjunction]
        disjunction = conjunction {"OR" conjunction}
        conjunction = unary {["AND"] unary}
        unary       = ("NOT" | "-") unary | "(" disjunction ")" | term

    recursing only through parentheses and negations, whose nesting MAX_DEPTH bounds."""

    def __init__(self, tokens: list[Token], length: int) -> None:
        self.tokens = tokens
        self.length = length
        self.at = 0

    def query(self) -> Node:
        if not self.tokens:
            return And(())
        node = self.disjunction(0)
        if self.at < len(self.tokens):
            raise QueryError("')' without a matching '('", self.tokens[self.at].position)
        return node

    def disjunction(self, depth: int) -> Node:
        terms = [self.conjunction(depth)]
        while self._next_is(Kind.OR):
            self.at += 1
            terms.append(self.conjunction(depth))
        return joined(Or, terms)

    def conjunction(self, depth: int) -> Node:
        terms = [self.unary(depth)]
        while self.at < len(self.tokens) and not self._next_is(Kind.OR, Kind.CLOSE):
            if self._next_is(Kind.AND):
                self.at += 1
            terms.append(self.unary(depth))
        return joined(And, terms)

    def unary(self, depth: int) -> Node:
        if self.at == len(self.tokens) or self._next_is(Kind.AND, Kind.OR, Kind.CLOSE):
            raise self._missing_term()
        token = self.tokens[self.at]
        self.at += 1
        if isinstance(token, Term):
            return token.leaf
        if depth == MAX_DEPTH:
            raise QueryError(
                f"more than {MAX_DEPTH} nested parentheses and negations", token.position
            )
        if token.kind is Kind.NOT:
            return Not(self.unary(depth + 1))
        node = self.disjunction(depth + 1)
        if not self._next_is(Kind.CLOSE):
            raise QueryError("'(' is never closed", token.position)
        self.at += 1
        return node

    def _next_is(self, *kinds: Kind) -> bool:
        token = self.tokens[self.at] if self.at < len(self.tokens) else None
        return isinstance(token, Symbol) and token.kind in kinds

    def _missing_term(self) -> QueryError:
        """Where a term should be and is not, said from what is around that place."""
        before = self.tokens[self.at - 1] if self.at else None
        after = self.tokens[self.at] if self.at < len(self.tokens) else None
        if isinstance(before, Symbol) and before.kind in (Kind.NOT, Kind.AND, Kind.OR):
            return QueryError(f"{before.text} needs a term after it", before.position)
        if isinstance(after, Symbol) and after.kind in (Kind.AND, Kind.OR):
            return QueryError(f"{after.text} needs a term before it", after.position)
        if isinstance(before, Symbol) and after is not None:
            return QueryError("empty parentheses", before.position)
        if isinstance(before, Symbol):
            return QueryError("'(' is never closed", before.position)
        return QueryError("')' without a matching '('", after.position if after else self.length)


def joined(kind: type[And] | type[Or], terms: list[Node]) -> Node:
    """One term as itself, several as `kind` of them, those of the same kind flattened in: the
    canonical form, so that `a (b c)` and `a b c` are one tree."""
    if len(terms) == 1:
        return terms[0]
    return kind(
        tuple(t for term in terms for t in (term.terms if isinstance(term, kind) else (term,)))
    )


_QUOTE_IF = re.compile(r"[\s()]")


def canonical(node: Node) -> str:
    """The query, written the one way `parse` reads back into the same tree."""
    match node:
        case Word(text):
            return text
        case Phrase(text):
            return f'"{text}"'
        case Exact(field, value):
            return f"{field}:{_value(value)}"
        case NameContains(text):
            return f"name~{_value(text)}"
        case Metric(name, op, value):
            return f"metrics.{name}{op}{value!r}"
        case Version(op, value):
            return f"version{op}{value}"
        case Created(op, value):
            return f"created{op}{value.isoformat()}"
        case Not(term):
            return f"-({canonical(term)})" if isinstance(term, And | Or) else f"-{canonical(term)}"
        case And(terms):
            # AND binds tighter than OR: only an Or inside it needs parentheses.
            return " ".join(
                f"({canonical(t)})" if isinstance(t, Or) else canonical(t) for t in terms
            )
        case Or(terms):
            return " OR ".join(canonical(t) for t in terms)


def _value(value: str) -> str:
    return f'"{value}"' if _QUOTE_IF.search(value) else value
