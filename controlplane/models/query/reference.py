"""What a search query means, stated in Python over plain records: the reference the Postgres
search (`sql`) is held to by a property test over random metadata, and the one place a question
about the language's meaning is answered.

Free text. A record's text is its title, description and tags, in that order, cut into tokens:
runs of letters and digits, lower-cased (`ResNet-50 for images` is `resnet`, `50`, `for`,
`images`). A word matches when it has tokens and every one of them is among the record's; a
phrase when its tokens occur in the record's text one right after the other.

Postgres agrees on words drawn from a vocabulary of lower-case ASCII letters whose English
stem is the word itself, and which are not stop words (`model`, `vision`, `resnet`, ...). Where
they differ, and why the property test draws its words from such a vocabulary:
- stemming (the `english` configuration): Postgres matches `models` with `model`, `running`
  with `run`; the reference does not;
- stop words: Postgres drops `the`, `of`, ...: a word that is one never matches there, and in a
  phrase it stands for any one word (`state of art` matches `state in art`);
- its parser keeps compound tokens besides their parts (`resnet-50` is also the token
  `resnet-50`, `a@b.org` an e-mail address), so a document holding `resnet 50` does not match
  the query word `resnet-50` there, but does here;
- case folding beyond ASCII follows the database's locale, here Python's `str.lower`.
The name's partial match (`name~`) likewise agrees on ASCII; exact matches and comparisons
agree everywhere.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from controlplane.models.query.nodes import (
    COMPARE,
    FACETS,
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

_TOKEN = re.compile(r"[^\W_]+")


@dataclass(frozen=True, slots=True)
class Record:
    """A model version as search sees it (the columns of `schema.model_versions`)."""

    name: str
    tenant: str
    title: str
    description: str
    tags: tuple[str, ...]
    framework: str | None
    domains: tuple[str, ...]
    license: str | None
    version: int
    created: datetime
    metrics: Mapping[str, float]

    def facet(self, facet: str) -> tuple[str, ...]:
        """The record's values of a facet (FACETS): none, one, or for `domain` several."""
        if facet == "domain":
            return self.domains
        value: str | None = getattr(self, facet)
        return () if value is None else (value,)

    def text(self) -> list[str]:
        return tokens(" ".join((self.title, self.description, *self.tags)))


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def matches(node: Node, record: Record) -> bool:
    match node:
        case Word(text):
            wanted = tokens(text)
            return bool(wanted) and set(wanted) <= set(record.text())
        case Phrase(text):
            return _occurs(tokens(text), record.text())
        case Exact("tag", value):
            return value in record.tags
        case Exact("domain", value):
            return value in record.domains
        case Exact(field, value):
            return bool(getattr(record, field) == value)
        case NameContains(text):
            return text.lower() in record.name.lower()
        case Metric(name, op, value):
            return name in record.metrics and bool(COMPARE[op](record.metrics[name], value))
        case Version(op, value):
            return bool(COMPARE[op](record.version, value))
        case Created():
            lower, upper, negated = node.bounds()
            inside = (lower is None or lower <= record.created) and (
                upper is None or record.created < upper
            )
            return inside != negated
        case Not(term):
            return not matches(term, record)
        case And(terms):
            return all(matches(term, record) for term in terms)
        case Or(terms):
            return any(matches(term, record) for term in terms)


def search(node: Node, records: Iterable[Record]) -> list[Record]:
    """The records the query matches, in their order."""
    return [record for record in records if matches(node, record)]


def facet_counts(records: Iterable[Record]) -> dict[str, dict[str, int]]:
    """For each facet, how many records have each value (a record without one is not counted;
    one with several domains is counted under each)."""
    counts: dict[str, Counter[str]] = {facet: Counter() for facet in FACETS}
    for record in records:
        for facet in FACETS:
            counts[facet].update(record.facet(facet))
    return {facet: dict(counter) for facet, counter in counts.items()}


def _occurs(phrase: list[str], text: list[str]) -> bool:
    width = len(phrase)
    return bool(phrase) and any(
        text[at : at + width] == phrase for at in range(len(text) - width + 1)
    )
