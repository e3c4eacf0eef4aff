"""The model repository on a real Postgres: publishing through the service, the `models`
projection's rows, and the search over them, as tenants see them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.locations import Roots
from controlplane.jobs.service import Jobs
from controlplane.models import catalog
from controlplane.models.errors import Unchanged
from controlplane.models.events import ModelAliasSet, Visibility
from controlplane.models.lifecycle import Deprecate, SetAlias, UpdateMetadata
from controlplane.models.projection import ModelsProjection
from controlplane.models.service import Models
from controlplane.models.updates import validate_update
from controlplane.projections.runner import ProjectionRunner
from controlplane.search.query import parse
from tests.controlplane.models.samples import metadata

pytestmark = pytest.mark.postgres

ACME = Metadata(actor="tenant:acme")
GLOBEX = Metadata(actor="tenant:globex")


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.fixture
def models(store: EventStore, tmp_path: Path) -> Models:
    return Models(store, FileArtifactStore(tmp_path / "artifacts"), Jobs(store), roots=Roots())


@pytest.fixture
def runner(pool: asyncpg.Pool, store: EventStore, db_url: str) -> ProjectionRunner:
    return ProjectionRunner(pool, store, LogListener(db_url), [ModelsProjection()])


async def test_published_versions_are_searched_as_each_tenant_may_see_them(
    models: Models, runner: ProjectionRunner, pool: asyncpg.Pool
) -> None:
    private = metadata(provenance=None, title="Crystal classifier", tags=["vision"])
    public = metadata(provenance=None, title="Speech recognizer", tags=["audio"], domains=[])
    first = await models.publish("acme", "crystals", chunks(b"weights-1"), private, ACME)
    second = await models.publish(
        "globex", "speech", chunks(b"weights-2"), public, GLOBEX, visibility=Visibility.PUBLIC
    )
    assert (first.version.number, second.version.number) == (1, 1)
    await runner.catch_up(ModelsProjection())

    acme = await catalog.search(pool, parse(""), viewer="acme")
    assert {(v.tenant, v.name) for v in acme.versions} == {
        ("acme", "crystals"),
        ("globex", "speech"),
    }
    globex = await catalog.search(pool, parse(""), viewer="globex")
    assert [(v.tenant, v.name) for v in globex.versions] == [("globex", "speech")]
    found = await catalog.search(pool, parse("crystal name~ryst"), viewer="acme")
    assert [v.name for v in found.versions] == ["crystals"]
    assert found.total == 1
    assert found.facets["framework"] == {"pytorch": 1}
    assert found.facets["domain"] == {"materials science": 1}

    model, _ = await models.execute(
        "acme",
        "crystals",
        UpdateMetadata(1, validate_update({"tags": ["vision", "x-ray"]}), models.clock.now()),
        ACME,
    )
    assert model.versions[0].metadata["tags"] == ["vision", "x-ray"]
    await models.execute("acme", "crystals", SetAlias("production", 1, models.clock.now()), ACME)
    await runner.catch_up(ModelsProjection())
    assert [
        v.name for v in (await catalog.search(pool, parse("tag:x-ray"), viewer="acme")).versions
    ] == ["crystals"]
    assert await catalog.aliases_of(pool, "acme", "crystals") == {"production": 1}


async def test_concurrent_alias_moves_each_land_once_in_one_chain(
    models: Models, runner: ProjectionRunner, pool: asyncpg.Pool
) -> None:
    document = metadata(provenance=None)
    for n in range(1, 5):
        await models.publish("acme", "m", chunks(b"w%d" % n), document, ACME)
    # Sixteen movers race for one alias: none is lost, and each event's `previous` is the
    # version the one before it set, so the history is one chain.
    moves = [SetAlias("production", 1 + n % 4, models.clock.now()) for n in range(16)]
    results = await asyncio.gather(
        *(models.execute("acme", "m", move, ACME) for move in moves), return_exceptions=True
    )
    landed = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    # A move to the version the alias names already is Unchanged: nothing to write.
    assert all(isinstance(r, Unchanged) for r in refused)
    history = [e.event for e in await models.history("acme", "m")]
    sets = [e for e in history if isinstance(e, ModelAliasSet)]
    assert len(sets) == len(landed)
    assert [s.previous for s in sets] == [None, *(s.version for s in sets[:-1])]
    await runner.catch_up(ModelsProjection())
    assert await catalog.aliases_of(pool, "acme", "m") == {"production": sets[-1].version}


async def test_same_bytes_share_one_blob_and_a_rebuild_gives_the_same_rows(
    models: Models, runner: ProjectionRunner, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    one = await models.publish(
        "acme", "a", chunks(b"same ", b"bytes"), metadata(provenance=None), ACME
    )
    two = await models.publish(
        "globex", "b", chunks(b"same bytes"), metadata(provenance=None, tags=["other"]), GLOBEX
    )
    assert one.version.artifact_sha256 == two.version.artifact_sha256
    assert len(list((tmp_path / "artifacts" / "sha256").rglob("*"))) == 3  # ab/, ab/cd/, blob

    # A retried publication (its answer lost) finds the version it made; nothing new.
    again = await models.publish(
        "acme", "a", chunks(b"same bytes"), metadata(provenance=None), ACME
    )
    assert (again.created, again.version.number) == (False, 1)

    await models.execute(
        "acme",
        "a",
        UpdateMetadata(1, validate_update({"metrics": {"f1": 0.5}}), models.clock.now()),
        ACME,
    )
    await models.execute("acme", "a", Deprecate(1, "superseded", models.clock.now()), ACME)
    await runner.catch_up(ModelsProjection())
    rows = "SELECT * FROM model_versions ORDER BY tenant, name, version"
    before = [dict(r) for r in await pool.fetch(rows)]
    assert before[0]["deprecated"] == "superseded"
    assert json.loads(before[0]["metrics"]) == {"accuracy": 0.93, "top_5": 0.99, "f1": 0.5}
    assert json.loads(before[0]["metadata"])["metrics"]["f1"] == 0.5
    await runner.rebuild("models")
    assert [dict(r) for r in await pool.fetch(rows)] == before
