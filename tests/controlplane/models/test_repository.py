"""The model repository on a real Postgres: publishing through the service, the `models`
projection's rows, and the search over them, as tenants see them."""

from __future__ import annotations

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
from controlplane.models.events import Visibility
from controlplane.models.lifecycle import SetAlias, UpdateMetadata
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

    model = await models.execute(
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
