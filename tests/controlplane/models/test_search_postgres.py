"""The model search on Postgres means what its reference says
(controlplane/models/query/reference.py), held over random versions and random queries: the
matches, their total, the facet counts, and every match exactly once across the pages of a
cursor, as each tenant may see them."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.models import catalog
from controlplane.models.query.nodes import (
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
from controlplane.models.query.query import joined
from controlplane.models.query.reference import Record, facet_counts, search
from controlplane.queries import Q

pytestmark = pytest.mark.postgres

WORDS = ("resnet", "vision", "bert", "crystal", "audio", "graph", "alpha", "tensor")
"""Words whose English stem is themselves and that are no stop words: where Postgres's full
text search and the reference agree (see the reference's docstring)."""
NAMES = ("res-net", "resnet50", "bert_base", "bert.large", "graph-x", "a1")
TENANTS = ("acme", "globex")
FRAMEWORKS = ("pytorch", "jax", "onnx")
LICENSES = ("MIT", "Apache-2.0", "NOASSERTION")
DOMAINS = ("vision", "nlp", "audio")
METRIC_VALUES = (0.1, 0.5, 0.9, 1.0)
TIMES = tuple(datetime(2026, 11, day, hour, tzinfo=UTC) for day in (29, 30) for hour in (0, 23))

words = st.lists(st.sampled_from(WORDS), max_size=4).map(" ".join)


@st.composite
def records(draw: st.DrawFn) -> list[tuple[Record, str]]:
    """Versions with their visibility, numbered 1.. per model."""
    found: list[tuple[Record, str]] = []
    numbers: dict[tuple[str, str], int] = {}
    for _ in range(draw(st.integers(0, 12))):
        tenant, name = draw(st.sampled_from(TENANTS)), draw(st.sampled_from(NAMES))
        numbers[tenant, name] = numbers.get((tenant, name), 0) + 1
        record = Record(
            name=name,
            tenant=tenant,
            title=draw(words.filter(bool)),
            description=draw(words),
            tags=tuple(draw(st.lists(st.sampled_from(WORDS), max_size=3, unique=True))),
            framework=draw(st.sampled_from(FRAMEWORKS)),
            domains=tuple(draw(st.lists(st.sampled_from(DOMAINS), max_size=2, unique=True))),
            license=draw(st.sampled_from(LICENSES)),
            version=numbers[tenant, name],
            created=draw(st.sampled_from(TIMES)),
            metrics=draw(
                st.dictionaries(
                    st.sampled_from(("accuracy", "loss")), st.sampled_from(METRIC_VALUES)
                )
            ),
        )
        found.append((record, draw(st.sampled_from(("private", "public")))))
    return found


leaves: st.SearchStrategy[Leaf] = st.one_of(
    st.sampled_from(WORDS).map(Word),
    st.lists(st.sampled_from(WORDS), min_size=2, max_size=3).map(" ".join).map(Phrase),
    st.builds(Exact, st.just("framework"), st.sampled_from(FRAMEWORKS)),
    st.builds(Exact, st.just("license"), st.sampled_from(LICENSES)),
    st.builds(Exact, st.just("domain"), st.sampled_from(DOMAINS)),
    st.builds(Exact, st.just("tenant"), st.sampled_from(TENANTS)),
    st.builds(Exact, st.just("tag"), st.sampled_from(WORDS)),
    st.builds(Exact, st.just("name"), st.sampled_from(NAMES)),
    st.builds(NameContains, st.sampled_from(("res", "NET", "_b", "t.l", "a", "ph-x", "zz"))),
    st.builds(
        Metric,
        st.sampled_from(("accuracy", "loss")),
        st.sampled_from(Op),
        st.sampled_from(METRIC_VALUES),
    ),
    st.builds(Version, st.sampled_from(Op), st.integers(0, 4)),
    st.builds(
        Created,
        st.sampled_from(Op),
        st.sampled_from((date(2026, 11, 29), date(2026, 11, 30), *TIMES)),
    ),
)
queries: st.SearchStrategy[Node] = st.recursive(
    leaves,
    lambda children: st.one_of(
        children.filter(lambda c: not isinstance(c, Not)).map(Not),
        st.lists(children, min_size=2, max_size=3).map(lambda terms: joined(And, terms)),
        st.lists(children, min_size=2, max_size=3).map(lambda terms: joined(Or, terms)),
    ),
    max_leaves=6,
)


async def _store(pool: asyncpg.Pool, versions: list[tuple[Record, str]]) -> None:
    """The rows the `models` projection writes for these versions, by its own statement."""
    documents = [
        {
            "title": r.title,
            "description": r.description,
            "tags": list(r.tags),
            "domains": list(r.domains),
            "framework": r.framework,
            "license": r.license,
            "metrics": dict(r.metrics),
        }
        for r, _ in versions
    ]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("DELETE FROM model_versions")
        await conn.execute(
            Q["insert_model_versions"],
            [r.tenant for r, _ in versions],
            [r.name for r, _ in versions],
            [r.version for r, _ in versions],
            ["0" * 64 for _ in versions],
            [0 for _ in versions],
            [json.dumps(d) for d in documents],
            [1 for _ in versions],
            [visibility for _, visibility in versions],
            [r.created for r, _ in versions],
            ["tenant:test" for _ in versions],
        )


def _key(tenant: str, name: str, version: int) -> tuple[str, str, int]:
    return tenant, name, version


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(versions=records(), query=queries, viewer=st.sampled_from((*TENANTS, None)))
async def test_postgres_finds_what_the_reference_finds(
    pool: asyncpg.Pool, versions: list[tuple[Record, str]], query: Node, viewer: str | None
) -> None:
    await _store(pool, versions)
    visible = [
        r for r, visibility in versions if viewer in (None, r.tenant) or visibility == "public"
    ]
    expected = search(query, visible)

    page = await catalog.search(pool, query, viewer=viewer, limit=catalog.MAX_PAGE)
    found = [_key(v.tenant, v.name, v.version) for v in page.versions]
    assert sorted(found) == sorted(_key(r.tenant, r.name, r.version) for r in expected), query
    assert page.total == len(expected)
    assert page.facets == facet_counts(expected)

    # Two at a time: every match once, in the one order, however the pages fall.
    paged: list[tuple[str, str, int]] = []
    cursor: str | None = None
    while True:
        part = await catalog.search(pool, query, viewer=viewer, limit=2, cursor=cursor)
        paged.extend(_key(v.tenant, v.name, v.version) for v in part.versions)
        if part.next_cursor is None:
            break
        cursor = part.next_cursor
    assert paged == found


async def test_the_vocabulary_is_where_postgres_and_the_reference_agree(
    pool: asyncpg.Pool,
) -> None:
    for word in WORDS:
        lexemes = await pool.fetchval("SELECT to_tsvector('english', $1)::text", word)
        assert lexemes == f"'{word}':1", f"{word!r} is stemmed or a stop word in Postgres"
