"""`trainyard models` as a user runs it: `trainyard` subprocesses against a served control
plane (a real process) on a real Postgres, as two tenants; and what the client checks itself,
whatever a server sends: a download's bytes, and tenants' text before a terminal shows it."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from controlplane.artifacts.filesystem import FileArtifactStore, default_root
from controlplane.models.metadata import Creator, DataType, ModelMetadata, validate_metadata
from controlplane.settings import Settings
from harness.served import ServedControlPlane
from tests.polling import eventually
from tests.tenancy import Tokens
from tests.trainyard.test_client_cli import Cli
from trainyard import ApiError, AsyncClient, render
from trainyard.models_commands import metadata_template

WEIGHTS = os.urandom(3 * 1024 * 1024 + 17)
"""More than a chunk of the upload and of the download, and not a whole number of them."""
PLACEHOLDERS = {
    "<title>": "Crystal structure classifier",
    "<your name>": "Ada Lovelace",
    "<framework>": "pytorch",
    "<module:function>": "crystals.serve:predict",
    "<type>": "ndarray",
}
"""What a person writes in place of `models init`'s placeholders."""


def user(tmp_path: Path, server: str, token: str) -> Cli:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env |= {
        "TRAINYARD_HOME": str(tmp_path / "client"),
        "TRAINYARD_SERVER": server,
        "TRAINYARD_TOKEN": token,
    }
    return Cli(env, tmp_path)


@pytest.fixture
async def cli(db_url: str, tokens: Tokens, tmp_path: Path) -> AsyncIterator[Cli]:
    """`trainyard` as tenant acme (`TRAINYARD_TOKEN=tokens.globex` for the other tenant),
    against a control plane whose data directory is tmp_path/server."""
    served = ServedControlPlane(db_url, tmp_path / "server")
    await served.start()
    yield user(tmp_path, served.url, tokens.acme)
    await served.stop()


async def until_found(cli: Cli, query: str, total: int, **env: str) -> None:
    """Once a search (as the tenant whose token `env` or `cli` has) finds `total` versions:
    its read model follows the log, a moment behind the writes."""
    token = env.get("TRAINYARD_TOKEN", cli.env["TRAINYARD_TOKEN"])

    async def found() -> bool:
        async with AsyncClient(cli.env["TRAINYARD_SERVER"], token) as client:
            return bool((await client.models(query))["total"] == total)

    await eventually(found)


async def metadata_file(cli: Cli, name: str = "model.yaml") -> Path:
    """A metadata file as a person makes one: `models init`, then each placeholder replaced."""
    path = cli.tmp_path / name
    made = await cli("models", "init", str(path))
    assert made.rc == 0, made.stderr
    path.write_text(filled(path.read_text()))
    return path


def filled(template: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        template = template.replace(placeholder, value)
    return template


@pytest.mark.processes
async def test_a_model_is_published_found_downloaded_aliased_updated_and_deprecated(
    cli: Cli, tmp_path: Path
) -> None:
    template = tmp_path / "model.yaml"
    metadata = await metadata_file(cli)
    kept = await cli("models", "init", str(template))
    assert kept.rc == 2 and "--force" in kept.stderr
    assert template.read_text() == metadata.read_text()
    # Filled in, the template is valid, and it named every field a person writes.
    document = yaml.safe_load(metadata.read_text())
    assert validate_metadata(document).title == PLACEHOLDERS["<title>"]
    assert set(document) == set(ModelMetadata.model_fields) - {"provenance"}
    assert set(document["creators"][0]) == set(Creator.model_fields)
    assert set(document["servable"]["input"]) == set(DataType.model_fields)

    artifact = tmp_path / "weights.pt"
    artifact.write_bytes(WEIGHTS)
    first = await cli("models", "publish", "crystals", str(artifact), "--metadata", str(metadata))
    assert (first.rc, first.stdout) == (0, "acme/crystals:1\n"), first.stderr
    artifact.write_bytes(WEIGHTS[::-1])
    second = await cli("models", "publish", "crystals", str(artifact), "--metadata", str(metadata))
    assert second.stdout == "acme/crystals:2\n", second.stderr
    job = str(uuid.uuid4())
    from_job = await cli(
        "models", "publish", "crystals", "--from-job", job, "--metadata", str(metadata)
    )
    assert from_job.rc == 4 and f"no job {job}" in from_job.stderr  # not found

    shown = (await cli("models", "show", "crystals:1", "--output", "json")).json()
    assert shown["version"]["artifact_sha256"] == hashlib.sha256(WEIGHTS).hexdigest()
    assert shown["version"]["size_bytes"] == len(WEIGHTS)
    assert shown["aliases"] == []
    text = (await cli("models", "show", "crystals")).stdout
    assert "acme/crystals:2" in text and PLACEHOLDERS["<title>"] in text
    assert "crystals.serve:predict" in text and "latest" in text

    downloaded = tmp_path / "downloaded.pt"
    got = await cli("models", "download", "crystals:1", "-o", str(downloaded))
    assert got.rc == 0, got.stderr
    assert downloaded.read_bytes() == WEIGHTS
    assert got.stdout == f"{hashlib.sha256(WEIGHTS).hexdigest()}  {downloaded}\n"
    again = await cli("models", "download", "crystals:1", "-o", str(downloaded))
    assert again.rc == 2 and "--force" in again.stderr

    aliased = await cli("models", "alias", "crystals:1", "production")
    assert aliased.stdout == "production names version 1\n", aliased.stderr
    model = (await cli("models", "ls", "crystals", "--output", "json")).json()
    assert [v["version"] for v in model["versions"]] == [2, 1]
    assert (model["aliases"], model["latest"]) == ({"production": 1}, 2)
    assert "production" in (await cli("models", "ls", "crystals")).stdout

    await until_found(cli, "", 2)
    listed = (await cli("models", "ls")).stdout
    assert listed.index("acme/crystals:2") < listed.index("acme/crystals:1")
    found = await cli("models", "search", "crystal framework:pytorch")
    assert "2 matching version(s)" in found.stdout and "framework: pytorch 2" in found.stdout
    assert (await cli("models", "search", "framework:onnx", "--output", "json")).json()[
        "total"
    ] == 0
    bad = await cli("models", "search", "size>3")
    assert bad.rc == 2 and "unknown field 'size'" in bad.stderr

    updated = await cli("models", "update", "crystals@production", "--metric", "accuracy=0.93")
    assert updated.stdout == "acme/crystals:1 updated\n", updated.stderr
    await until_found(cli, "metrics.accuracy>=0.9", 1)
    accurate = await cli("models", "search", "metrics.accuracy>=0.9", "--output", "json")
    assert [v["reference"] for v in accurate.json()["versions"]] == ["acme/crystals:1"]

    refused = await cli("models", "deprecate", "crystals:1", "--reason", "superseded")
    assert refused.rc == 1 and "alias" in refused.stderr
    deprecated = await cli("models", "deprecate", "crystals:2", "--reason", "overfits")
    assert deprecated.stdout == "acme/crystals:2 deprecated: overfits\n", deprecated.stderr
    assert (await cli("models", "ls", "crystals", "--output", "json")).json()["latest"] == 1


@pytest.mark.processes
async def test_another_tenant_sees_a_public_model_by_its_tenant_s_name_and_no_private_one(
    cli: Cli, tokens: Tokens, tmp_path: Path
) -> None:
    metadata = await metadata_file(cli)
    artifact = tmp_path / "weights.pt"
    artifact.write_bytes(WEIGHTS)
    for name, visibility in (("secret", []), ("shared", ["--public"])):
        published = await cli(
            "models", "publish", name, str(artifact), "--metadata", str(metadata), *visibility
        )
        assert published.rc == 0, published.stderr

    globex = {"TRAINYARD_TOKEN": tokens.globex}
    hidden = await cli("models", "show", "acme/secret", **globex)
    assert hidden.rc == 4, hidden.stderr
    assert (await cli("models", "show", "shared", **globex)).rc == 4  # globex's own: none
    shown = await cli("models", "show", "acme/shared", "--output", "json", **globex)
    assert shown.json()["version"]["reference"] == "acme/shared:1"
    copy = tmp_path / "copy.pt"
    got = await cli("models", "download", "acme/shared", "-o", str(copy), **globex)
    assert got.rc == 0, got.stderr
    assert copy.read_bytes() == WEIGHTS
    await until_found(cli, "", 1, **globex)
    listed = await cli("models", "ls", "--output", "json", **globex)
    assert [v["reference"] for v in listed.json()["versions"]] == ["acme/shared:1"]

    # Only acme tells where its model's events go, and never to an internal address.
    url = "http://93.184.216.34/hook"
    hooked = await cli("models", "webhook", "shared", url)
    assert hooked.rc == 0, hooked.stderr
    assert (await cli("models", "ls", "shared", "--output", "json")).json()["webhook_url"] == url
    theirs = await cli("models", "ls", "acme/shared", "--output", "json", **globex)
    assert theirs.json()["webhook_url"] is None
    assert (await cli("models", "webhook", "acme/shared", url, **globex)).rc == 1
    internal = await cli("models", "webhook", "shared", "http://127.0.0.1:9/hook")
    assert internal.rc == 1 and "url: " in internal.stderr  # 403: may not send there
    assert (await cli("models", "webhook", "shared", "--remove")).rc == 0
    assert (await cli("models", "ls", "shared", "--output", "json")).json()["webhook_url"] is None


@pytest.mark.processes
async def test_a_corrupted_artifact_is_never_downloaded(cli: Cli, tmp_path: Path) -> None:
    metadata = await metadata_file(cli)
    artifact = tmp_path / "weights.pt"
    artifact.write_bytes(WEIGHTS)
    published = await cli(
        "models", "publish", "crystals", str(artifact), "--metadata", str(metadata)
    )
    assert published.rc == 0, published.stderr
    # The served control plane's store, as it finds it: under its data directory.
    settings = dataclasses.replace(Settings.from_env(), home=tmp_path / "server")
    blob = FileArtifactStore(default_root(settings)).blob_path(hashlib.sha256(WEIGHTS).hexdigest())
    blob.chmod(0o600)
    damaged = bytearray(blob.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    blob.write_bytes(damaged)

    target = tmp_path / "downloads" / "crystals.pt"
    target.parent.mkdir()
    got = await cli("models", "download", "crystals", "-o", str(target))
    assert got.rc != 0
    assert "nothing was written" in got.stderr
    assert list(target.parent.iterdir()) == []


@pytest.mark.processes
async def test_bad_metadata_and_arguments_are_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    # No server listens there: each refusal is the command's own.
    cli = user(tmp_path, "http://127.0.0.1:9", "t")
    metadata = await metadata_file(cli)
    text = metadata.read_text().replace("orcid: null", "orcid: 0000-0002-1825-0090")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    line = 1 + text.splitlines().index("    orcid: 0000-0002-1825-0090")
    refused = await cli("models", "publish", "crystals", str(bad), "--metadata", str(bad))
    assert refused.rc == 2
    assert f"{bad}: invalid metadata: creators.0.orcid (line {line}): " in refused.stderr

    both = await cli(
        "models",
        "publish",
        "crystals",
        str(metadata),
        "--from-job",
        "j",
        "--metadata",
        str(metadata),
    )
    assert both.rc == 2 and "not both" in both.stderr
    neither = await cli("models", "webhook", "crystals")
    assert neither.rc == 2 and "URL or --remove" in neither.stderr
    nothing = await cli("models", "update", "crystals:1")
    assert nothing.rc == 2 and "needs something to change" in nothing.stderr
    immutable = tmp_path / "update.json"
    immutable.write_text('{"title": "another"}')
    changed = await cli("models", "update", "crystals:1", "--metadata", str(immutable))
    assert changed.rc == 2 and "title: immutable once published" in changed.stderr


async def test_a_download_whose_bytes_are_not_the_version_s_leaves_no_file(
    tmp_path: Path,
) -> None:
    # A server (or anything between) that sends a whole body of the wrong bytes: the client's
    # own check is all that stands between them and the file.
    view = {"reference": "acme/m:1", "version": 1, "size_bytes": len(WEIGHTS)}
    view["artifact_sha256"] = hashlib.sha256(WEIGHTS).hexdigest()

    async def version(request: web.Request) -> web.Response:
        return web.json_response(view)

    async def artifact(request: web.Request) -> web.Response:
        return web.Response(body=WEIGHTS[::-1], content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get("/v1/models/m/versions/1", version)
    app.router.add_get("/v1/models/m/versions/1/artifact", artifact)
    target = tmp_path / "m.pt"
    target.write_bytes(b"the file that was there")
    async with TestServer(app) as server, AsyncClient(str(server.make_url("")), "t") as client:
        with pytest.raises(ApiError, match=r"arrived corrupted .* nothing was written"):
            await client.download_model("m:1", target)
    assert os.listdir(tmp_path) == ["m.pt"]
    assert target.read_bytes() == b"the file that was there"


def test_tenants_text_is_shown_with_its_control_characters_escaped() -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J\u202eevil"
    document = yaml.safe_load(filled(metadata_template("model.yaml")))
    document |= {"title": hostile, "tags": [hostile], "description": f"one\n{hostile}"}
    version = {
        "reference": "acme/m:1",
        "artifact_sha256": "0" * 64,
        "size_bytes": 1,
        "metadata": document,
        "visibility": "public",
        "deprecated": hostile,
        "created": "2026-01-01T00:00:00Z",
        "published_by": "tenant:acme",
        "updated_at": "2026-01-01T00:00:00Z",
    }
    page = {"versions": [version], "total": 1, "facets": {"domain": {hostile: 1}}}
    for shown in (render.version_view(version, []), render.search_page(page, None)):
        assert not any((ord(c) < 0x20 and c != "\n") or c == "\u202e" for c in shown)
        assert "\\x1b]0;owned\\x07" in shown
    assert "  one\n  \\x1b" in render.version_view(version, [])
