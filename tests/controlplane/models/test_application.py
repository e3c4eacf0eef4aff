"""The model repository's facade on a real Postgres, without HTTP: what each caller may see of
a model, whose model an admin's request is about, and the limits a publication is held to."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from aiohttp import ThreadedResolver

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.locations import Roots
from controlplane.jobs.service import Jobs
from controlplane.models.application import ModelsApplication
from controlplane.models.events import Visibility
from controlplane.models.publication import UploadPublication
from controlplane.models.service import Models
from controlplane.projections.runner import ProjectionRunner
from controlplane.refusals import Refusal, Refused
from controlplane.tenants.principals import Principal
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import create_tenant, set_limits
from controlplane.webhooks.targets import CheckingResolver
from tests.controlplane.models.samples import metadata

pytestmark = pytest.mark.postgres

ACME, GLOBEX = Principal("acme", is_admin=False), Principal("globex", is_admin=False)
ADMIN = Principal(None, is_admin=True)
BY_ACME = Metadata(actor="tenant:acme", tenant="acme")


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.fixture
async def tenants(pool: asyncpg.Pool, store: EventStore, db_url: str) -> ProjectionRunner:
    runner = ProjectionRunner(pool, store, LogListener(db_url), [TenantsProjection()])
    for name in ("acme", "globex"):
        await create_tenant(store, runner, name, actor="test")
    return runner


@pytest.fixture
async def facade(
    tenants: ProjectionRunner, pool: asyncpg.Pool, store: EventStore, tmp_path: Path
) -> ModelsApplication:
    models = Models(store, FileArtifactStore(tmp_path / "artifacts"), Jobs(store), roots=Roots())
    # Loopback allowed, so that a webhook URL is admitted without a lookup.
    allowed = [ipaddress.ip_network("127.0.0.0/8")]
    return ModelsApplication(
        models, pool, store, webhook_targets=CheckingResolver(ThreadedResolver(), allowed)
    )


async def upload(facade: ModelsApplication, name: str, data: bytes, visibility: Visibility) -> int:
    publishing = await facade.publishing(ACME, "acme", name)
    document = metadata(provenance=None, title=f"{name} {data!r}")
    publication = UploadPublication.model_validate(
        {"metadata": document.model_dump(), "visibility": visibility}
    )
    view, created = await facade.publish_upload(publishing, publication, chunks(data), BY_ACME)
    assert created
    return view.version


async def test_another_tenant_sees_the_public_versions_and_nothing_of_the_owners(
    facade: ModelsApplication,
) -> None:
    assert await upload(facade, "m", b"private", Visibility.PRIVATE) == 1
    assert await upload(facade, "m", b"public", Visibility.PUBLIC) == 2
    await facade.set_alias(ACME, "acme", "m", "draft", 1, BY_ACME)
    await facade.set_alias(ACME, "acme", "m", "stable", 2, BY_ACME)
    await facade.set_webhook(ACME, "acme", "m", "http://127.0.0.1:9/hook", BY_ACME)

    owners = await facade.model(ACME, None, "m")
    assert [v.version for v in owners.versions] == [2, 1]
    assert (owners.aliases, owners.webhook_url) == (
        {"draft": 1, "stable": 2},
        "http://127.0.0.1:9/hook",
    )
    others = await facade.model(GLOBEX, "acme", "m")
    assert [v.version for v in others.versions] == [2]
    assert (others.aliases, others.latest, others.webhook_url) == ({"stable": 2}, 2, None)
    assert (await facade.version(GLOBEX, "acme", "m", "stable")).visibility is Visibility.PUBLIC
    for selector in ("1", "draft"):
        with pytest.raises(Refusal) as hidden:
            await facade.version(GLOBEX, "acme", "m", selector)
        assert hidden.value.kind is Refused.NOT_FOUND
    with pytest.raises(Refusal) as history:
        await facade.history(GLOBEX, "acme", "m")
    assert history.value.kind is Refused.NOT_FOUND
    events = [e.event for e in (await facade.history(ADMIN, "acme", "m")).history]
    assert events.count("ModelVersionPublished") == 2 and "ModelWebhookSet" in events


async def test_an_admin_names_a_tenant_that_exists(facade: ModelsApplication) -> None:
    with pytest.raises(Refusal) as unnamed:
        await facade.model(ADMIN, None, "m")
    assert (unnamed.value.kind, unnamed.value.field) == (Refused.MALFORMED, "tenant")
    with pytest.raises(Refusal) as unknown:
        await facade.publishing(ADMIN, "initech", "m")
    assert (unknown.value.kind, unknown.value.field) == (Refused.INVALID, "tenant")
    assert unknown.value.message == "no tenant named 'initech'"


async def test_an_upload_past_its_tenants_room_is_too_large_and_says_the_limit(
    facade: ModelsApplication, tenants: ProjectionRunner, store: EventStore, tmp_path: Path
) -> None:
    await set_limits(store, tenants, "acme", {"artifact_bytes": 10}, actor="test")
    with pytest.raises(Refusal) as refused:
        await upload(facade, "m", b"eleven bytes", Visibility.PRIVATE)
    assert (refused.value.kind, refused.value.field) == (Refused.TOO_LARGE, "artifact_bytes")
    assert "its artifact_bytes limit is 10" in refused.value.message
    # The server's own limit, when it is the smaller, is said as the artifact's.
    await set_limits(store, tenants, "acme", {"artifact_bytes": 1000}, actor="test")
    facade.models.max_artifact_bytes = 5
    with pytest.raises(Refusal) as server:
        await upload(facade, "m", b"eleven bytes", Visibility.PRIVATE)
    assert (server.value.kind, server.value.field) == (Refused.TOO_LARGE, "artifact")
    assert not [p for p in (tmp_path / "artifacts").rglob("*") if p.is_file()]
