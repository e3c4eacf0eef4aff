"""`file://` data sources and results locations: only under the operator's roots for the
tenant, after resolving symlinks and `..`; refused with 403 naming the field, writing nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.http.app import create_app
from controlplane.jobs.locations import (
    LocationRefused,
    Roots,
    check_manifest_locations,
    parse_roots,
)
from harness.served import free_port
from tests.tenancy import Tokens

Client = TestClient[Any, Any]

MANIFEST: dict[str, Any] = {"name": "j", "image": "i", "command": ["train"]}


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    for tenant in ("acme", "globex"):
        (tmp_path / "data" / tenant).mkdir(parents=True)
        (tmp_path / "results" / tenant).mkdir(parents=True)
    return Roots(data=(f"{tmp_path}/data/{{tenant}}",), results=(f"{tmp_path}/results/{{tenant}}",))


@pytest.fixture
async def client(db_url: str, roots: Roots) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(db_url, roots=roots))) as client:
        yield client


async def event_count(owner: asyncpg.Connection) -> int:
    return int(await owner.fetchval("SELECT count(*) FROM events WHERE stream_id LIKE 'job-%'"))


async def post(client: Client, token: str, **changes: Any) -> tuple[int, dict[str, Any]]:
    response = await client.post(
        "/v1/jobs", json={**MANIFEST, **changes}, headers={"Authorization": f"Bearer {token}"}
    )
    body: dict[str, Any] = await response.json()
    return response.status, body


async def test_locations_under_the_tenant_s_roots_are_accepted(
    client: Client, tokens: Tokens, tmp_path: Path
) -> None:
    status, body = await post(
        client,
        tokens.acme,
        data={"source": f"file://{tmp_path}/data/acme/set.bin"},
        results={"location": f"file://{tmp_path}/results/acme/run-1"},
    )
    assert status == 201, body


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        # Another tenant's root, a path outside every root, and `..` climbing out of one.
        ({"data": {"source": "file://{tmp}/data/globex/set.bin"}}, "data.source"),
        ({"data": {"source": "file:///etc/shadow"}}, "data.source"),
        ({"results": {"location": "file://{tmp}/results/acme/../globex/x"}}, "results.location"),
        ({"results": {"location": "file:///etc"}}, "results.location"),
        # A symlink inside the tenant's own root that points at another tenant's.
        ({"results": {"location": "file://{tmp}/results/acme/link/x"}}, "results.location"),
    ],
)
async def test_locations_outside_the_tenant_s_roots_are_refused_and_nothing_is_written(
    client: Client,
    tokens: Tokens,
    tmp_path: Path,
    owner: asyncpg.Connection,
    changes: dict[str, dict[str, str]],
    field: str,
) -> None:
    (tmp_path / "results" / "acme" / "link").symlink_to(tmp_path / "results" / "globex")
    before = await event_count(owner)
    resolved = {
        key: {k: v.replace("{tmp}", str(tmp_path)) for k, v in value.items()}
        for key, value in changes.items()
    }
    status, body = await post(client, tokens.acme, **resolved)
    assert status == 403, body
    assert body["field"] == field
    assert "tenant 'acme'" in body["error"]
    assert await event_count(owner) == before


async def test_without_roots_file_locations_are_refused(
    db_url: str, tokens: Tokens, tmp_path: Path
) -> None:
    async with TestClient(TestServer(create_app(db_url, roots=Roots()))) as client:
        status, body = await post(client, tokens.acme, results={"location": f"file://{tmp_path}/r"})
        assert status == 403 and body["field"] == "results.location"
        assert "TRAINYARD_RESULTS_ROOTS" in body["error"]
        # Other schemes need no root.
        status, body = await post(client, tokens.acme, data={"source": "https://example.com/d"})
        assert status == 201, body


def test_roots_come_from_the_environment_and_must_be_absolute() -> None:
    roots = Roots.from_env(
        {"TRAINYARD_DATA_ROOTS": "/d/{tenant}:/shared", "TRAINYARD_RESULTS_ROOTS": ""}
    )
    assert roots == Roots(data=("/d/{tenant}", "/shared"), results=())
    with pytest.raises(ValueError, match="TRAINYARD_DATA_ROOTS: 'rel' is not an absolute"):
        parse_roots("/ok:rel", "TRAINYARD_DATA_ROOTS")


def test_a_root_itself_is_a_data_source_but_never_a_results_location(tmp_path: Path) -> None:
    # Storing replaces the location: the operator's root is not the tenant's to replace.
    roots = Roots(data=(str(tmp_path),), results=(str(tmp_path),))
    check_manifest_locations(f"file://{tmp_path}", f"file://{tmp_path}/r", roots, "t")
    with pytest.raises(LocationRefused, match=r"results\.location"):
        check_manifest_locations(None, f"file://{tmp_path}", roots, "t")
    with pytest.raises(LocationRefused, match=r"data\.source"):
        check_manifest_locations(f"file://{tmp_path.parent}", None, roots, "t")


@pytest.mark.parametrize("setting", ["TRAINYARD_DATA_ROOTS", "TRAINYARD_RESULTS_ROOTS"])
def test_a_control_plane_with_a_relative_root_does_not_start(
    db_url: str, tmp_path: Path, setting: str
) -> None:
    started = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--port", str(free_port())],
        env={
            **os.environ,
            "TRAINYARD_DATABASE_URL": db_url,
            "TRAINYARD_HOME": str(tmp_path),
            setting: "/srv/ok:relative/{tenant}",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 1
    # One line naming the setting, no traceback.
    assert started.stderr.strip().splitlines() == [
        f"trainyard: {setting}: 'relative/{{tenant}}' is not an absolute path"
    ], started.stderr
