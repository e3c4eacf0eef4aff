"""A search query cut into tokens: parentheses, the operators AND, OR, NOT and `-`, and terms
(already leaves of the syntax tree, checked by `terms`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from controlplane.models.query.errors import QueryError
from controlplane.models.query.nodes import Leaf, Phrase, Word
from controlplane.models.query.terms import term


class Kind(StrEnum):
    OPEN = "("
    CLOSE = ")"
    NOT = "NOT"
    AND = "AND"
    OR = "OR"


@dataclass(frozen=True, slots=True)
class Symbol:
    kind: Kind
    text: str
    """As written: `-` or `NOT` for a negation, so that an error names what the user typed."""
    position: int


@dataclass(frozen=True, slots=True)
class Term:
    leaf: Leaf
    position: int


Token = Symbol | Term

_KEYWORDS = {"AND": Kind.AND, "OR": Kind.OR, "NOT": Kind.NOT}
_STOP = re.compile(r'[\s()"]')
_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)(>=|<=|!=|=|<|>|:|~)")
# Postgres text cannot hold NUL and UTF-8 no lone surrogate; the other control characters
# (tabs and newlines aside) are refused with them, since no query needs one.
_REFUSED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
ADMITTED = "^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f]*$"
"""A query without what `_REFUSED` finds, for JSON Schema (surrogates are the transport's)."""


def tokenize(query: str) -> list[Token]:
    if refused := _REFUSED.search(query):
        raise QueryError(
            f"control character U+{ord(refused.group()):04X} in the query", refused.start()
        )
    tokens: list[Token] = []
    at = 0
    while at < len(query):
        char = query[at]
        if char.isspace():
            at += 1
        elif char in "()":
            tokens.append(Symbol(Kind(char), char, at))
            at += 1
        elif char == "-":
            follower = query[at + 1 : at + 2]
            if not follower or follower.isspace() or follower == ")":
                raise QueryError("'-' must be followed, without a space, by a term", at)
            tokens.append(Symbol(Kind.NOT, char, at))
            at += 1
        elif char == '"':
            text, end = _quoted(query, at)
            if not text.split():
                raise QueryError("empty phrase", at)
            tokens.append(Term(Phrase(" ".join(text.split())), at))
            at = end
        elif field := _FIELD.match(query, at):
            value_at = field.end()
            value, at = (
                _quoted(query, value_at)
                if query[value_at : value_at + 1] == '"'
                else _bare(query, value_at)
            )
            if not value:
                raise QueryError(f"{field.group(1)}{field.group(2)} needs a value", value_at)
            tokens.append(
                Term(
                    term(field.group(1), field.group(2), value, field.start(), value_at),
                    field.start(),
                )
            )
        else:
            word, end = _bare(query, at)
            if word[0] in "<>=!~:":
                # `version >= 3` would otherwise search for the words `version`, `>=` and `3`,
                # and silently find nothing.
                raise QueryError("write a comparison without spaces, as in version>=3", at)
            keyword = _KEYWORDS.get(word)
            tokens.append(Symbol(keyword, word, at) if keyword else Term(Word(word), at))
            at = end
    return tokens


def _quoted(query: str, at: int) -> tuple[str, int]:
    """The text between the double quote at `at` and the next one, and where it ends."""
    end = query.find('"', at + 1)
    if end < 0:
        raise QueryError("a quote is never closed (a quoted text cannot hold '\"')", at)
    return query[at + 1 : end], end + 1


def _bare(query: str, at: int) -> tuple[str, int]:
    """The text from `at` up to a space, a parenthesis, a quote or the end."""
    stop = _STOP.search(query, at)
    end = stop.start() if stop else len(query)
    return query[at:end], end
