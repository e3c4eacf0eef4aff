"""MLflow's half of `trainyard bench registry`: the same model versions in MLflow's model
registry, on a scratch database of the same Postgres server, and the same searches asked the way
MLflow's API lets a user ask them (the `bench` extra installs MLflow; without it, importing this
module fails and `bench.model_repository` leaves this half out).

The store. `MlflowClient` with its tracking and registry URIs both on the scratch database,
through SQLAlchemy and psycopg 3 (`postgresql+psycopg://`), in a schema of its own (`mlflow`:
the database is Trainyard's migrated one, whose `model_versions` table would clash with
MLflow's). MLflow creates its tables on the first client call (`setup_s`, not counted in
`load_s`). Telemetry is turned off (`MLFLOW_DISABLE_TELEMETRY`) before MLflow is imported: the
benchmark sends nothing off the machine.

Loading (`load_s`, `publish_per_s`). Through the client API, no batch tricks or direct store
writes: LOADERS threads (as many as Trainyard's half publishes at once), each taking a model
at a time: `create_registered_model(name, tags={"tenant": ...})`, then for each version in
order, the same few KiB of weights Trainyard stores written to a file under a temporary folder
and `create_model_version(name, source=<that file's folder>, description=..., tags=...,
await_creation_for=0)`; MLflow numbers the versions 1, 2, ... as the specs do (checked). That is
the registry's cheapest path: no runs, no logged models, no artifact repository. A version's
tags are its searchable metadata (strings, as MLflow's tags are):

- `tenant`, `title`, `framework`, `license`: as they are;
- `tags`, `domains`: JSON lists (read back to rebuild the version for the Python check), and
  one tag per value, `tag.<tag>` and `domain.<domain>`, = `true`, so that `tag:X` and `domain:X`
  are one exact tag filter (a tag holds one string; MLflow has no list-valued tags);
- `metrics.<name>`: the metric's value written as Python writes the float;
- `text`: the title, the description and the tags, one string: MLflow's filter has no OR and
  no full-text search, and the description attribute cannot be filtered on, so a user who
  wants free text to narrow the search writes it into one tag to ILIKE.

The description is also the version's own `description`; `created` is MLflow's
`creation_timestamp`. After the load, ANALYZE on MLflow's registry tables (`analyze_s`), as
autovacuum would soon do on a live server: see `_analyze`.

Searching (`search_p50_ms`, `search_p99_ms`, `per_case`). Each case's query is cut into the
filters MLflow can run: the query in disjunctive normal form, each conjunction one
`search_model_versions(filter_string, max_results=PAGE)` call, paged through with
`page_token` to its end (PAGE is the client's default page, 10,000: one call per filter at the
default size), the versions of several filters merged. A term becomes:

- `name~text`: `name ILIKE '%text%'` (exact but for LIKE's wildcards; checked anyway);
- `name:X`: `name = 'X'`; `framework:X`, `license:X`, `tenant:X`: tags.`<field>` = 'X';
  `domain:X`: tags.`domain.X` = 'true'; `tag:X`: tags.`tag.X` = 'true';
- a word or a phrase: tags.`text` ILIKE '%token%' for each of its tokens (a superset: a
  substring, not a token, and a phrase's order is not asked);
- `metrics.NAME op number`: tags.`metrics.NAME` LIKE '%', only that the version has the metric:
  tags are strings, and MLflow compares them only with =, !=, LIKE and ILIKE;
- `version op N`: `version_number op N` (exact: MLflow compares the version as a number);
- `created op time`: nothing (model-version search takes no time attribute: MLflow refuses
  `creation_timestamp` there, its keys being name, version_number, run_id and source_path);
- `OR`: one filter per side (MLflow's filter has no OR), the versions merged; more than
  MAX_FILTERS conjunctions and the query is asked with no filter at all;
- `NOT`: nothing (`!=` on a tag misses the versions without the tag).

What MLflow returns is a superset of the answer; the benchmark finishes each case in Python as the
user would have to, inside the timed part: each version rebuilt from its tags
(`controlplane.models.query.reference.Record`), the query evaluated on it
(`controlplane.models.query.reference.matches`: the exact words and phrases, the metric ranges,
...), the total counted, the facet counts computed (`facet_counts`: framework, domain, tenant,
license), and the first page of 50 ordered much as Trainyard orders it (by how often the query's
words occur in the text, a stand-in for Postgres's `ts_rank`, then newest first). Outside the timed
part, each answer's set of versions must be `model_repository_data.expected`'s and its facets the
reference's, or the benchmark fails: both halves answer the same questions.
`search_registered_models` is not used: every term of the cases is about a version.

`per_case` gives, besides the latencies, the part of the median spent in MLflow's calls
(`fetch_p50_ms`; the rest is the Python finishing), the filters MLflow ran (`filters`; null: no
filter) and how many versions they returned (`fetched`) against how many match (`total`).
"""

from __future__ import annotations

import os

# Before MLflow is imported: it starts its telemetry client on import.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import json
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import product
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import mlflow
import sqlalchemy
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion

from bench.model_repository import CONCURRENCY, ms, percentile
from bench.model_repository_data import SearchCase, VersionSpec, expected, record
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
from controlplane.models.query.query import parse
from controlplane.models.query.reference import (
    Record,
    facet_counts,
    matches,
    search,
    tokens,
)

LOADERS = CONCURRENCY
"""Threads creating models and versions at once: as many as Trainyard's half publishes with."""
PAGE = 10_000
"""Versions a `search_model_versions` call asks for: the client's default `max_results`."""
MAX_FILTERS = 8
"""Filters one query may become; past that, one unfiltered listing (every version)."""
SHOWN = 50
"""The first page, as Trainyard's half asks for."""
SCHEMA = "mlflow"
REGISTRY_TABLES = (
    "registered_models",
    "registered_model_tags",
    "registered_model_aliases",
    "model_versions",
    "model_version_tags",
)
MAX_TAG_KEY = 250
_TAG_KEY = re.compile(r"[/\w.\- :]*")
"""What MLflow allows in a tag's key (mlflow.utils.validation); a value that cannot be one gets
no `tag.<value>` or `domain.<value>` tag, and a filter on it narrows nothing."""

Key = tuple[str, str, int]
Conjunction = frozenset[str]


def run_mlflow(
    specs: Sequence[VersionSpec], cases: Sequence[SearchCase], url: str, *, repeats: int
) -> dict[str, Any]:
    """Load `specs` into MLflow's registry on the database of `url` (`postgresql://...`), then
    run each of `cases` `repeats` times, checking every answer; the timings."""
    store_url = _sqlalchemy_url(url)
    engine = sqlalchemy.create_engine(_sqlalchemy_url(url, schema=None))
    try:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA}"'))
    finally:
        engine.dispose()

    started = time.perf_counter()
    client = MlflowClient(tracking_uri=store_url, registry_uri=store_url)
    # The first call makes the stores, which create MLflow's tables.
    client.search_registered_models(max_results=1)
    setup_s = time.perf_counter() - started

    with tempfile.TemporaryDirectory() as home:
        load_s = _load(client, specs, Path(home))
    started = time.perf_counter()
    _analyze(store_url)
    analyze_s = time.perf_counter() - started
    runs = _searches(client, specs, cases, repeats)

    every = [t for run in runs for t in run.seconds]
    return {
        "mlflow_version": mlflow.__version__,
        "setup_s": round(setup_s, 2),
        "load_s": round(load_s, 2),
        "publish_per_s": round(len(specs) / load_s, 1),
        "analyze_s": round(analyze_s, 2),
        "search_p50_ms": ms(statistics.median(every)),
        "search_p99_ms": ms(percentile(every, 0.99)),
        "per_case": {run.case.label: run.report() for run in runs},
    }


def _analyze(store_url: str) -> None:
    """Statistics on MLflow's registry tables, as autovacuum gathers them on a live server
    within a minute or so of such a load. Fresh tables have none: the planner then takes them
    for a row each and joins each version with a scan of every tag, which grows with the square
    of the versions (at 1,000 versions, `framework:jax` took 350 ms instead of 31)."""
    engine = sqlalchemy.create_engine(store_url)
    try:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"ANALYZE {', '.join(REGISTRY_TABLES)}"))
    finally:
        engine.dispose()


def _sqlalchemy_url(url: str, schema: str | None = SCHEMA) -> str:
    """`url` for SQLAlchemy with psycopg 3, its sessions in `schema` (None: the default)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a postgresql:// URL: {parts.scheme}://...")
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
    if schema is not None:
        query.append(("options", f"-csearch_path={schema}"))
    return urlunsplit(parts._replace(scheme="postgresql+psycopg", query=urlencode(query)))


# Loading.


def _load(client: MlflowClient, specs: Sequence[VersionSpec], home: Path) -> float:
    """Seconds to create every registered model and version, LOADERS models at a time (a
    model's versions in order)."""
    by_model: dict[str, list[VersionSpec]] = {}
    for spec in specs:
        versions = by_model.setdefault(spec.name, [])
        if versions and versions[0].tenant != spec.tenant:
            # MLflow's model names are global: two tenants' models of one name would be one.
            raise ValueError(f"{spec.name}: a model of that name in two tenants")
        versions.append(spec)

    def load_model(versions: list[VersionSpec]) -> None:
        first = versions[0]
        client.create_registered_model(first.name, tags={"tenant": first.tenant})
        for spec in versions:
            folder = home / spec.name / str(spec.version)
            folder.mkdir(parents=True)
            # The same bytes Trainyard's half stores for the version.
            (folder / "weights").write_bytes(
                f"{spec.tenant}/{spec.name}:{spec.version}".encode() * 256
            )
            found = record(spec)
            created = client.create_model_version(
                spec.name,
                source=str(folder),
                description=found.description,
                tags=_tags(found),
                await_creation_for=0,
            )
            if int(created.version) != spec.version:
                raise AssertionError(f"{spec.name} registered as {created.version}")

    started = time.perf_counter()
    with ThreadPoolExecutor(LOADERS) as pool:
        # list(): a failure in a thread is raised here.
        list(pool.map(load_model, by_model.values()))
    return time.perf_counter() - started


def _tags(found: Record) -> dict[str, str]:
    tags = {
        "tenant": found.tenant,
        "title": found.title,
        "tags": json.dumps(list(found.tags)),
        "domains": json.dumps(list(found.domains)),
        "text": "\n".join((found.title, found.description, " ".join(found.tags))),
    }
    if found.framework is not None:
        tags["framework"] = found.framework
    if found.license is not None:
        tags["license"] = found.license
    tags.update({f"tag.{tag}": "true" for tag in found.tags})
    tags.update({f"domain.{domain}": "true" for domain in found.domains})
    tags.update({f"metrics.{name}": repr(value) for name, value in found.metrics.items()})
    return {key: value for key, value in tags.items() if _tag_key(key)}


def _record(version: ModelVersion) -> Record:
    """The version as the reference evaluation sees it, from what MLflow returned."""
    tags: dict[str, str] = version.tags
    return Record(
        name=version.name,
        tenant=tags["tenant"],
        title=tags["title"],
        description=version.description or "",
        tags=tuple(json.loads(tags["tags"])),
        framework=tags.get("framework"),
        domains=tuple(json.loads(tags["domains"])),
        license=tags.get("license"),
        version=int(version.version),
        created=datetime.fromtimestamp(version.creation_timestamp / 1000, UTC),
        metrics={
            key.removeprefix("metrics."): float(value)
            for key, value in tags.items()
            if key.startswith("metrics.")
        },
    )


# Searching.


@dataclass(frozen=True, slots=True)
class _Answer:
    keys: set[Key]
    facets: dict[str, dict[str, int]]
    page: list[Key]
    fetched: int
    fetch_s: float
    """Of the answer's time, the part spent in MLflow's calls."""


@dataclass(slots=True)
class _Case:
    """One case's plan, the reference's answer, and what each of its runs took."""

    case: SearchCase
    query: Node
    plan: list[str | None]
    wanted: set[Key]
    facets: dict[str, dict[str, int]]
    seconds: list[float] = field(default_factory=list)
    fetch_seconds: list[float] = field(default_factory=list)
    fetched: int = 0

    def report(self) -> dict[str, Any]:
        return {
            "p50_ms": ms(statistics.median(self.seconds)),
            "p99_ms": ms(percentile(self.seconds, 0.99)),
            "fetch_p50_ms": ms(statistics.median(self.fetch_seconds)),
            "filters": None if self.plan == [None] else [p for p in self.plan if p is not None],
            "fetched": self.fetched,
            "total": len(self.wanted),
        }


def _searches(
    client: MlflowClient, specs: Sequence[VersionSpec], cases: Sequence[SearchCase], repeats: int
) -> list[_Case]:
    """Every case `repeats` times, in the order Trainyard's half runs them (each case once,
    `repeats` times over), each answer checked against the reference's."""
    references = [record(spec) for spec in specs]
    runs = []
    for case in cases:
        query = parse(case.query)
        runs.append(
            _Case(
                case,
                query,
                _plan(query),
                expected(references, case),
                facet_counts(search(query, references)),
            )
        )
    for _ in range(repeats):
        for run in runs:
            started = time.perf_counter()
            answer = _answer(client, run.query, run.plan)
            run.seconds.append(time.perf_counter() - started)
            run.fetch_seconds.append(answer.fetch_s)
            run.fetched = answer.fetched
            if answer.keys != run.wanted or answer.facets != run.facets:
                raise AssertionError(f"{run.case.label}: MLflow's answer is not the reference's")
    return runs


def _answer(client: MlflowClient, query: Node, plan: list[str | None]) -> _Answer:
    """What the user's code does for one search: MLflow's filters, then the rest in Python."""
    found: dict[tuple[str, int], ModelVersion] = {}
    started = time.perf_counter()
    for filter_string in plan:
        token: str | None = None
        while True:
            page = client.search_model_versions(filter_string, max_results=PAGE, page_token=token)
            for version in page:
                found[(version.name, int(version.version))] = version
            token = page.token
            if not token:
                break
    fetch_s = time.perf_counter() - started
    matched = [r for r in map(_record, found.values()) if matches(query, r)]
    words = [t for text in _free_text(query) for t in tokens(text)]

    def order(r: Record) -> tuple[int, datetime, str, str, int]:
        text = r.text()
        return (sum(text.count(word) for word in words), r.created, r.tenant, r.name, r.version)

    shown = sorted(matched, key=order, reverse=True)[:SHOWN]
    return _Answer(
        keys={(r.tenant, r.name, r.version) for r in matched},
        facets=facet_counts(matched),
        page=[(r.tenant, r.name, r.version) for r in shown],
        fetched=len(found),
        fetch_s=fetch_s,
    )


def _free_text(node: Node) -> list[str]:
    """The words and phrases the query looks for (not those it excludes)."""
    match node:
        case Word(text) | Phrase(text):
            return [text]
        case And(terms) | Or(terms):
            return [t for term in terms for t in _free_text(term)]
        case _:
            return []


def _plan(query: Node) -> list[str | None]:
    """The filter strings whose versions together hold every version `query` matches (None:
    no filter, every version)."""
    conjunctions = _dnf(query)
    return [" AND ".join(sorted(c)) if c else None for c in conjunctions]


_EVERYTHING: list[Conjunction] = [frozenset()]


def _dnf(node: Node) -> list[Conjunction]:
    """Conjunctions of MLflow filter clauses, any of which a matching version meets: the
    disjunctive normal form of the query with each term widened to what MLflow can ask."""
    match node:
        case And(terms):
            result = _EVERYTHING
            for term in terms:
                result = _simplest([a | b for a, b in product(result, _dnf(term))])
            return result
        case Or(terms):
            return _simplest([c for term in terms for c in _dnf(term)])
        case Not():
            return _EVERYTHING
        case _:
            return [frozenset(_clauses(node))]


def _simplest(conjunctions: list[Conjunction]) -> list[Conjunction]:
    if len(conjunctions) > MAX_FILTERS or frozenset() in conjunctions:
        return _EVERYTHING
    return list(dict.fromkeys(conjunctions))


def _clauses(leaf: Node) -> list[str]:
    """The clauses one term narrows MLflow's search by (none: it cannot)."""
    match leaf:
        case Word(text) | Phrase(text):
            return [f"tags.`text` ILIKE '%{token}%'" for token in tokens(text) if _safe(token)]
        case Exact(field, value):
            return _exact(field, value)
        case NameContains(text) if _safe(text) and "\\" not in text:
            return [f"name ILIKE '%{text}%'"]
        case Metric(name) if _tag_key(f"metrics.{name}"):
            return [f"tags.`metrics.{name}` LIKE '%'"]
        case Version(op, value):
            return [f"version_number {op.value} {value}"]
        case Created():
            return []
        case _:
            return []


def _exact(field: str, value: str) -> list[str]:
    if field in ("domain", "tag"):
        key = f"{field}.{value}"
        return [f"tags.`{key}` = 'true'"] if _tag_key(key) else []
    if not _safe(value):
        return []
    if field == "name":
        return [f"name = '{value}'"]
    return [f"tags.`{field}` = '{value}'"]


def _safe(value: str) -> bool:
    """Whether the value can stand in a filter string's quotes (MLflow has no escapes)."""
    return not any(c in value for c in "'`\"")


def _tag_key(key: str) -> bool:
    """Whether MLflow takes `key` as a tag's key."""
    return len(key) <= MAX_TAG_KEY and _TAG_KEY.fullmatch(key) is not None
