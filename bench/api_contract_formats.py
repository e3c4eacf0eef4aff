"""Hypothesis strategies for the string formats the document names beyond JSON Schema's own,
which `trainyard bench contract` registers with schemathesis (bench/api_contract_hooks.py).

`orcid`: an ORCID iD, whose last character is the ISO 7064 MOD 11-2 check digit of the others
(computed here from ORCID's definition).

`model-query`: the model search language of `GET /v1/models?q=` (docs/user-guide.md, "Model
search queries"; controlplane/models/query/query.py). A grammar, which no `pattern` can state:
parentheses nest. Generated from the grammar as the guide writes it, not from the server's
parser, so that a query the guide allows and the server refuses is a finding.
"""

from __future__ import annotations

from datetime import date

from hypothesis import strategies as st

FACETS = ("framework", "domain", "tenant", "license", "tag", "name")
"""The fields matched exactly with `:`."""
COMPARISONS = ("=", "!=", "<", "<=", ">", ">=")
KEYWORDS = {"AND", "OR", "NOT"}
MAX_VERSION = 2**31 - 1

# Letters and digits of any script; a word may not start with '-' (a negation) nor hold a
# quote, a parenthesis, a space or an operator character (it would be a field or a comparison).
_WORD = st.text(alphabet=st.characters(categories=["L", "N"]), min_size=1, max_size=12).filter(
    lambda word: word not in KEYWORDS
)
_PHRASE = st.text(
    alphabet=st.characters(categories=["L", "N", "P", "S", "Zs"], exclude_characters='"'),
    min_size=1,
    max_size=24,
).filter(str.strip)
_METRIC = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,15}", fullmatch=True)
_NUMBER = st.one_of(
    st.integers(-(10**9), 10**9).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
)
# Within the guide's bounds: a time a day from the ends of years 1 to 9999 is refused.
_DAY = st.dates(min_value=date(1000, 1, 1), max_value=date(9000, 12, 31)).map(date.isoformat)
_MOMENT = st.builds(
    lambda day, hour, minute, zone: f"{day}T{hour:02d}:{minute:02d}:00{zone}",
    _DAY,
    st.integers(0, 23),
    st.integers(0, 59),
    st.sampled_from(["Z", "", "+02:00", "-05:30"]),
)


def _quoted(text: str) -> str:
    return f'"{text}"'


_TERM = st.one_of(
    _WORD,
    _PHRASE.map(_quoted),
    st.builds(lambda value: f"name~{value}", _WORD),
    st.builds(
        lambda field, value: f"{field}:{value}",
        st.sampled_from(FACETS),
        st.one_of(_WORD, _PHRASE.map(_quoted)),
    ),
    st.builds(
        lambda op, version: f"version{op}{version}",
        st.sampled_from(COMPARISONS),
        st.integers(0, MAX_VERSION),
    ),
    st.builds(
        lambda op, moment: f"created{op}{moment}",
        st.sampled_from(COMPARISONS),
        st.one_of(_DAY, _MOMENT),
    ),
    st.builds(
        lambda name, op, number: f"metrics.{name}{op}{number}",
        _METRIC,
        st.sampled_from(COMPARISONS),
        _NUMBER,
    ),
)


def _negated(term: str) -> st.SearchStrategy[str]:
    return st.sampled_from([f"-{term}", f"NOT {term}"])


def _combined(parts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(lambda a, b: f"{a} {b}", parts, parts),
        st.builds(lambda a, b: f"{a} AND {b}", parts, parts),
        st.builds(lambda a, b: f"{a} OR {b}", parts, parts),
        parts.map(lambda part: f"({part})"),
        parts.flatmap(_negated),
    )


MODEL_QUERY: st.SearchStrategy[str] = st.one_of(
    st.just(""),
    # Few leaves, so that no query passes the guide's bounds (32 terms, 8 levels of nesting).
    st.recursive(_TERM, _combined, max_leaves=6),
)
"""A query the user guide allows."""


def _with_check_digit(digits: str) -> str:
    """An ORCID iD of 15 digits and their check digit, in groups of four."""
    total = 0
    for digit in digits:
        total = (total + int(digit)) * 2
    check = (12 - total % 11) % 11
    whole = digits + ("X" if check == 10 else str(check))
    return "-".join(whole[at : at + 4] for at in range(0, 16, 4))


ORCID: st.SearchStrategy[str] = st.from_regex(r"[0-9]{15}", fullmatch=True).map(_with_check_digit)
"""An ORCID iD whose check digit matches."""
