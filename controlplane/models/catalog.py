"""Reading the model repository's read model: search (a query of `controlplane.models.query`,
ranked, faceted, a page at a time behind a cursor) and a model's versions and aliases, each as
the asking tenant may see them (its own versions and every tenant's public ones; None: the admin,
everything)."""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
from sqlalchemy import (
    ColumnElement,
    Double,
    and_,
    func,
    literal,
    or_,
    select,
    true,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import REGCONFIG

from controlplane.database import Executor
from controlplane.models.errors import InvalidModel
from controlplane.models.metadata import INT4_MAX
from controlplane.models.names import MODEL_NAME
from controlplane.models.query.nodes import FACETS, And, Node, Or, Phrase, Word
from controlplane.models.query.sql import TEXT_SEARCH_CONFIG, where
from controlplane.queries import Q
from controlplane.schema import model_versions
from controlplane.statements import asyncpg_args
from controlplane.tenants.validation import NAME as TENANT_NAME

MAX_PAGE = 200


@dataclass(frozen=True, slots=True)
class VersionRow:
    """A version as the read model has it (the metadata with its updates applied)."""

    tenant: str
    name: str
    version: int
    artifact_sha256: str
    size_bytes: int
    metadata: Mapping[str, Any]
    metadata_schema: int
    visibility: str
    deprecated: str | None
    created: datetime
    published_by: str
    updated_at: datetime

    @classmethod
    def of(cls, row: asyncpg.Record) -> VersionRow:
        return cls(
            tenant=row["tenant"],
            name=row["name"],
            version=row["version"],
            artifact_sha256=row["artifact_sha256"],
            size_bytes=row["size_bytes"],
            metadata=json.loads(row["metadata"]),
            metadata_schema=row["metadata_schema"],
            visibility=row["visibility"],
            deprecated=row["deprecated"],
            created=row["created"],
            published_by=row["published_by"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class SearchPage:
    versions: list[VersionRow]
    total: int
    """How many versions match in all (every page's)."""
    facets: dict[str, dict[str, int]]
    """For each facet, how many matching versions have each value (domain: each of theirs)."""
    next_cursor: str | None
    """The cursor of the next page; None on the last."""


@dataclass(frozen=True, slots=True)
class _After:
    rank: float
    created: datetime
    tenant: str
    name: str
    version: int


async def search(
    pool: asyncpg.Pool,
    query: Node,
    *,
    viewer: str | None,
    limit: int = 50,
    cursor: str | None = None,
) -> SearchPage:
    """The versions `query` matches that `viewer` may see: ranked by how well their text
    matches the query's free-text terms (when it has any), then newest first."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidModel(f"limit: from 1 to {MAX_PAGE}")
    after = _decode(cursor)
    matching = and_(_visible(viewer), where(query))
    rank = _rank(query)
    order = (rank, model_versions.c.created, *_KEY)
    page = (
        select(*_SHOWN, rank.label("rank"))
        .where(matching)
        .order_by(*(column.desc() for column in order))
        .limit(limit + 1)
    )
    if after is not None:
        page = page.where(
            tuple_(*order)
            < tuple_(
                literal(after.rank, Double),
                literal(after.created),
                literal(after.tenant),
                literal(after.name),
                literal(after.version),
            )
        )
    # One snapshot for both statements: under read committed, a version the projection
    # commits between them would be counted in the total but missing from the page.
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        rows = await conn.fetch(*asyncpg_args(page))
        facets = await _counts(conn, matching)
    # Each version has one tenant: the tenant facet counts every match once.
    total = sum(facets["tenant"].values())
    shown = rows[:limit]
    next_cursor = _encode(shown[-1]) if len(rows) > limit else None
    return SearchPage([VersionRow.of(row) for row in shown], total, facets, next_cursor)


_KEY = (model_versions.c.tenant, model_versions.c.name, model_versions.c.version)
_SHOWN = [c for c in model_versions.c if c.name not in ("search", "name_trigrams", "metrics")]
"""What a page reads of each version: not the columns only the search's terms use."""


def _visible(viewer: str | None) -> ColumnElement[bool]:
    if viewer is None:
        return true()
    return or_(model_versions.c.tenant == viewer, model_versions.c.visibility == "public")


def _rank(query: Node) -> ColumnElement[float]:
    """How well a version's text matches the query's free text that is not negated (0 for a
    query with none): the words and phrases, all of them, as one tsquery."""
    texts = list(_free_text(query))
    if not texts:
        return literal(0.0, Double)
    config = literal(TEXT_SEARCH_CONFIG, REGCONFIG)
    parts = [
        func.phraseto_tsquery(config, t.text)
        if isinstance(t, Phrase)
        else func.plainto_tsquery(config, t.text)
        for t in texts
    ]
    tsquery: ColumnElement[Any] = parts[0]
    for part in parts[1:]:
        tsquery = tsquery.op("||")(part)
    # As double precision: the cursor carries the rank back as a Python float, which must
    # compare equal to the one it came from.
    return func.ts_rank(model_versions.c.search, tsquery).cast(Double)


def _free_text(node: Node) -> Sequence[Word | Phrase]:
    match node:
        case Word() | Phrase():
            return [node]
        case And(terms) | Or(terms):
            return [t for term in terms for t in _free_text(term)]
        case _:
            return []  # a negated term (nothing to rank by) or a field's term


async def _counts(conn: Executor, matching: ColumnElement[bool]) -> dict[str, dict[str, int]]:
    """The matching versions' counts per facet value, in one statement that reads the matching
    rows once (Postgres materializes a CTE read more than once) and counts their narrow
    columns."""
    v = model_versions.c
    matches = select(v.tenant, v.framework, v.license, v.domains).where(matching).cte("matches")
    m = matches.c
    branches = [
        select(literal(facet), m[facet], func.count()).group_by(m[facet])
        for facet in FACETS
        if facet != "domain"
    ]
    domain = func.unnest(m.domains)
    branches.append(select(literal("domain"), domain, func.count()).group_by(domain))
    counts: dict[str, dict[str, int]] = {facet: {} for facet in FACETS}
    statement = union_all(*(branch.select_from(matches) for branch in branches))
    for facet, value, n in await conn.fetch(*asyncpg_args(statement)):
        counts[facet][value] = n
    return counts


def _encode(row: asyncpg.Record) -> str:
    values = [row["rank"], row["created"].isoformat(), row["tenant"], row["name"], row["version"]]
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode()


def _decode(cursor: str | None) -> _After | None:
    if cursor is None:
        return None
    try:
        rank, created, tenant, name, version = json.loads(base64.urlsafe_b64decode(cursor))
        after = _After(
            float(rank), datetime.fromisoformat(created), str(tenant), str(name), int(version)
        )
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        after = None
    # What _encode wrote, or nothing: a cursor is not for clients to make up, and its values
    # go to Postgres, which refuses a NUL, a naive time or an integer past its column's.
    if (
        after is None
        or not math.isfinite(after.rank)
        or after.created.tzinfo is None
        or not TENANT_NAME.fullmatch(after.tenant)
        or not MODEL_NAME.fullmatch(after.name)
        or not 1 <= after.version <= INT4_MAX
    ):
        raise InvalidModel("cursor: not a cursor this search gave")
    return after


async def versions_of(
    pool: asyncpg.Pool, tenant: str, name: str, *, viewer: str | None
) -> list[VersionRow]:
    """The model's versions `viewer` may see, newest first (none: no such model, to them)."""
    rows = await pool.fetch(Q["model_versions_of"], tenant, name, viewer)
    return [VersionRow.of(row) for row in rows]


async def aliases_of(pool: asyncpg.Pool, tenant: str, name: str) -> dict[str, int]:
    rows = await pool.fetch(Q["model_aliases_of"], tenant, name)
    return {row["alias"]: row["version"] for row in rows}


async def versions_of_job(pool: asyncpg.Pool, job_id: UUID) -> list[VersionRow]:
    return [VersionRow.of(row) for row in await pool.fetch(Q["model_versions_of_job"], job_id)]
