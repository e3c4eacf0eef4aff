"""The model repository's API through a real HTTP server on a real Postgres: publication by a
streamed upload (checked, size-limited, all or nothing), reads by number, alias and latest,
download verified end to end, search, aliases, updates, deprecation, and what other tenants
may see of it."""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.artifacts.store import CHUNK_SIZE
from controlplane.http import models as models_http
from controlplane.http.app import create_app
from controlplane.http.keys import MODELS
from tests.controlplane.models.samples import DOCUMENT
from tests.polling import eventually
from tests.tenancy import Tokens, auth, event_count

Client = TestClient[Any, Any]

UPLOADED = {k: v for k, v in copy.deepcopy(DOCUMENT).items() if k != "provenance"}
"""A valid document as a user uploads it: the provenance is the repository's to fill in."""
WEIGHTS = b"\x80\x02 the model's weights " * 1000


@pytest.fixture
async def client(db_url: str, tmp_path: Path) -> AsyncIterator[Client]:
    app = create_app(db_url, poll_interval=0.2, artifacts=FileArtifactStore(tmp_path / "artifacts"))
    async with TestClient(TestServer(app)) as client:
        yield client


def upload_form(
    artifact: bytes, document: Any = None, *, artifact_first: bool = False, **publication: Any
) -> aiohttp.MultipartWriter:
    """An upload's body: `publication` then `artifact`, or the other way round."""
    document = {"metadata": UPLOADED if document is None else document, **publication}
    parts = [("publication", json.dumps(document).encode()), ("artifact", artifact)]
    return parts_form(*(reversed(parts) if artifact_first else parts))


def parts_form(*parts: tuple[str, bytes]) -> aiohttp.MultipartWriter:
    """A multipart/form-data body of these parts, in this order."""
    form = aiohttp.MultipartWriter("form-data")
    for name, data in parts:
        if name == "publication":
            part = form.append(data, {"Content-Type": "application/json"})
            part.set_content_disposition("form-data", name=name)
        else:
            part = form.append(data)
            part.set_content_disposition("form-data", name=name, filename="model.pt")
    return form


async def publish(
    client: Client, token: str, name: str, artifact: bytes = WEIGHTS, **publication: Any
) -> dict[str, Any]:
    response = await client.post(
        f"/v1/models/{name}/versions",
        data=upload_form(artifact, **publication),
        headers=auth(token),
    )
    assert response.status == 201, await response.text()
    view: dict[str, Any] = await response.json()
    return view


async def searched(client: Client, token: str, total: int, **params: str) -> dict[str, Any]:
    """The search's page once it finds `total` versions: a version shows in the search once
    the projection has it, which may be a moment after its publication's 201."""
    page: dict[str, Any] = {}

    async def found() -> bool:
        nonlocal page
        page = await (await client.get("/v1/models", params=params, headers=auth(token))).json()
        return page["total"] == total

    await eventually(found)
    return page


def blobs(tmp_path: Path) -> list[Path]:
    """Every file under the store, its staging folder (tmp/) included."""
    return [p for p in (tmp_path / "artifacts").rglob("*") if p.is_file()]


def spools(tmp_path: Path) -> list[str]:
    """The files this process (the test server's) holds open in the store's staging folder:
    an upload's spool has no name, so its descriptor is all there is of it."""
    staging = f"{tmp_path.resolve() / 'artifacts' / 'tmp'}/"
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed since it was listed
            continue
        if target.startswith(staging):
            found.append(target)
    return found


async def nothing_kept(owner: asyncpg.Connection, before: int, tmp_path: Path) -> None:
    """No event appended since `before`, no blob and no staging file left, no spool open
    (closed in its own thread, maybe a moment after the answer)."""
    assert await event_count(owner) == before
    assert blobs(tmp_path) == []

    async def closed() -> bool:
        return spools(tmp_path) == []

    await eventually(closed, seconds=5)


async def test_an_upload_is_published_read_downloaded_and_found(
    client: Client, tokens: Tokens
) -> None:
    digest = hashlib.sha256(WEIGHTS).hexdigest()
    response = await client.post(
        "/v1/models/crystals/versions",
        data=upload_form(WEIGHTS, sha256=digest),
        headers=auth(tokens.acme),
    )
    assert response.status == 201, await response.text()
    assert response.headers["Location"] == "/v1/models/crystals/versions/1"
    view = await response.json()
    assert (view["reference"], view["artifact_sha256"], view["size_bytes"]) == (
        "acme/crystals:1",
        digest,
        len(WEIGHTS),
    )
    assert view["metadata"]["title"] == UPLOADED["title"]
    assert (view["visibility"], view["deprecated"], view["published_by"]) == (
        "private",
        None,
        "tenant:acme",
    )
    # The document describes exactly what is sent.
    schemas = (await (await client.get("/openapi.json")).json())["components"]["schemas"]
    assert set(view) == set(schemas["VersionView"]["properties"])

    for selector in ("1", "latest"):
        got = await client.get(
            f"/v1/models/crystals/versions/{selector}", headers=auth(tokens.acme)
        )
        assert await got.json() == view

    download = await client.get(
        "/v1/models/crystals/versions/latest/artifact", headers=auth(tokens.acme)
    )
    assert download.status == 200
    assert await download.read() == WEIGHTS
    assert download.headers["ETag"] == f'"{digest}"'
    assert download.headers["Content-Length"] == str(len(WEIGHTS))

    found = await searched(client, tokens.acme, 1, q="crystal framework:pytorch")
    assert [v["reference"] for v in found["versions"]] == ["acme/crystals:1"]
    assert (found["facets"]["framework"], found["next_cursor"]) == ({"pytorch": 1}, None)
    for values in (
        [0, "2020-01-01T00:00:00+00:00", "acme\u0000", "m", 1],  # a NUL for Postgres
        [0, "2020-01-01T00:00:00", "acme", "m", 1],  # a time without its offset
        [0, "2020-01-01T00:00:00+00:00", "acme", "m", 2**40],  # past the column's integers
    ):
        forged = base64.urlsafe_b64encode(json.dumps(values).encode()).decode()
        refused = await client.get(
            "/v1/models", params={"cursor": forged}, headers=auth(tokens.acme)
        )
        assert (refused.status, (await refused.json())["field"]) == (400, "cursor")
    bad = await client.get("/v1/models", params={"q": "size>3"}, headers=auth(tokens.acme))
    assert bad.status == 400
    assert (await bad.json())["field"] == "q"

    schema = await (
        await client.get("/v1/schemas/model-metadata", headers=auth(tokens.acme))
    ).json()
    assert "creators" in schema["required"] and schema["$id"].startswith("urn:trainyard")


async def test_publishing_the_same_upload_again_finds_its_version(
    client: Client, tokens: Tokens, tmp_path: Path
) -> None:
    first = await publish(client, tokens.acme, "m")
    again = await client.post(
        "/v1/models/m/versions", data=upload_form(WEIGHTS), headers=auth(tokens.acme)
    )
    assert again.status == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert await again.json() == first
    # The same again, but public: not what version 1 is, so not answered as done.
    public = await client.post(
        "/v1/models/m/versions",
        data=upload_form(WEIGHTS, visibility="public"),
        headers=auth(tokens.acme),
    )
    assert public.status == 409, await public.text()
    # Other metadata with the same bytes: a new version sharing the one blob.
    other = {**UPLOADED, "title": "Crystal classifier, retuned"}
    second = await client.post(
        "/v1/models/m/versions", data=upload_form(WEIGHTS, other), headers=auth(tokens.acme)
    )
    assert (await second.json())["version"] == 2
    assert len(blobs(tmp_path)) == 1


async def test_a_refused_upload_writes_nothing(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, tmp_path: Path
) -> None:
    before = await event_count(owner)
    bad = {**UPLOADED, "title": "", "creators": [{"name": "A", "orcid": "0000-0000-0000-0000"}]}
    response = await client.post(
        "/v1/models/m/versions", data=upload_form(WEIGHTS, bad), headers=auth(tokens.acme)
    )
    assert response.status == 422
    fields = {f["field"] for f in (await response.json())["fields"]}
    assert fields == {"metadata.title", "metadata.creators.0.orcid"}

    claimed = {**UPLOADED, "provenance": DOCUMENT["provenance"]}
    response = await client.post(
        "/v1/models/m/versions", data=upload_form(WEIGHTS, claimed), headers=auth(tokens.acme)
    )
    assert response.status == 422
    assert [f["field"] for f in (await response.json())["fields"]] == ["metadata.provenance"]

    misplaced = await client.post(
        "/v1/models/m/versions",
        data=upload_form(WEIGHTS, checkpoint_step=3),
        headers=auth(tokens.acme),
    )
    # An upload's publication has no job fields: its schema leaves them out.
    assert misplaced.status == 422
    assert [f["field"] for f in (await misplaced.json())["fields"]] == ["checkpoint_step"]

    mismatch = await client.post(
        "/v1/models/m/versions",
        data=upload_form(WEIGHTS, sha256="0" * 64),
        headers=auth(tokens.acme),
    )
    assert mismatch.status == 422
    assert (await mismatch.json())["field"] == "sha256"

    client.app[MODELS].max_artifact_bytes = len(WEIGHTS) - 1
    too_large = await client.post(
        "/v1/models/m/versions", data=upload_form(WEIGHTS), headers=auth(tokens.acme)
    )
    assert too_large.status == 413
    assert (await too_large.json())["field"] == "artifact"

    huge = aiohttp.MultipartWriter("form-data")
    huge.append(b" " * (2 * 1024 * 1024)).set_content_disposition("form-data", name="publication")
    refused = await client.post("/v1/models/m/versions", data=huge, headers=auth(tokens.acme))
    assert (refused.status, (await refused.json())["field"]) == (413, "publication")

    for name, data, status in [("Not-A-Name", upload_form(b"x"), 422), ("m", b"not JSON", 400)]:
        refused = await client.post(
            f"/v1/models/{name}/versions", data=data, headers=auth(tokens.acme)
        )
        assert refused.status == status, await refused.text()

    assert await event_count(owner) == before
    assert blobs(tmp_path) == []


async def test_an_upload_whose_artifact_comes_first_is_published_with_the_same_bytes(
    client: Client, tokens: Tokens, tmp_path: Path
) -> None:
    # Several chunks' worth, not a multiple of one: the spool is written and read back in
    # chunks.
    weights = os.urandom(3 * CHUNK_SIZE + 12345)
    digest = hashlib.sha256(weights).hexdigest()
    response = await client.post(
        "/v1/models/first/versions",
        data=upload_form(weights, artifact_first=True, sha256=digest),
        headers=auth(tokens.acme),
    )
    assert response.status == 201, await response.text()
    view = await response.json()
    assert (view["artifact_sha256"], view["size_bytes"]) == (digest, len(weights))
    download = await client.get("/v1/models/first/versions/1/artifact", headers=auth(tokens.acme))
    assert download.status == 200
    assert await download.read() == weights

    # The other order, the same bytes: the same blob, and the same publication again is the
    # version the first order made.
    other = await publish(client, tokens.acme, "second", weights)
    assert other["artifact_sha256"] == digest
    again = await client.post(
        "/v1/models/first/versions", data=upload_form(weights), headers=auth(tokens.acme)
    )
    assert again.status == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert await again.json() == view
    assert [p.parent.name for p in blobs(tmp_path)] == [digest[2:4]]  # one blob, no spool
    assert spools(tmp_path) == []


async def test_an_oversize_artifact_first_is_refused_as_in_the_other_order(
    client: Client,
    tokens: Tokens,
    owner: asyncpg.Connection,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = await event_count(owner)
    weights = b"w" * (5 * CHUNK_SIZE)
    bound = 2 * CHUNK_SIZE + 1
    client.app[MODELS].max_artifact_bytes = bound
    spooled: list[int] = []
    write = models_http._Spool._write

    def counted(self: Any, chunk: bytes) -> None:
        spooled.append(len(chunk))
        write(self, chunk)

    monkeypatch.setattr(models_http._Spool, "_write", counted)
    answers = []
    for artifact_first in (False, True):
        response = await client.post(
            "/v1/models/m/versions",
            data=upload_form(weights, artifact_first=artifact_first),
            headers=auth(tokens.acme),
        )
        answers.append((response.status, await response.json()))
    assert answers[0] == answers[1]
    assert answers[1][0] == 413 and answers[1][1]["field"] == "artifact", answers
    # The spool stopped at the bound: no byte past it was written.
    assert spooled and sum(spooled) <= bound
    await nothing_kept(owner, before, tmp_path)


async def test_an_invalid_publication_after_its_artifact_is_refused_as_in_the_other_order(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, tmp_path: Path
) -> None:
    before = await event_count(owner)
    bad = {**UPLOADED, "title": "", "creators": [{"name": "A", "orcid": "0000-0000-0000-0000"}]}
    claimed = {**UPLOADED, "provenance": DOCUMENT["provenance"]}
    over = {**UPLOADED, "description": "x" * (2 * 1024 * 1024)}
    cases: list[tuple[int, Any, dict[str, Any]]] = [
        (422, bad, {}),
        (422, claimed, {}),
        (422, None, {"checkpoint_step": 3}),
        (422, None, {"from_job": "00000000-0000-0000-0000-000000000000"}),
        (422, None, {"sha256": "0" * 64}),  # checked by the store, as the bytes are written
        (422, None, {"visibility": "secret"}),
        (413, over, {}),
    ]
    for status, document, publication in cases:
        answers = []
        for artifact_first in (False, True):
            response = await client.post(
                "/v1/models/m/versions",
                data=upload_form(WEIGHTS, document, artifact_first=artifact_first, **publication),
                headers=auth(tokens.acme),
            )
            answers.append((response.status, await response.json()))
        assert answers[0] == answers[1], publication
        assert answers[1][0] == status, answers[1]

    for raw in (b"not JSON", b"[1, 2"):
        answers = []
        for parts in (
            [("publication", raw), ("artifact", WEIGHTS)],
            [("artifact", WEIGHTS), ("publication", raw)],
        ):
            response = await client.post(
                "/v1/models/m/versions", data=parts_form(*parts), headers=auth(tokens.acme)
            )
            answers.append((response.status, await response.json()))
        assert answers[0] == answers[1]
        assert answers[1][0] == 400
    await nothing_kept(owner, before, tmp_path)


async def test_a_part_missing_twice_or_not_taken_is_refused_and_keeps_nothing(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, tmp_path: Path
) -> None:
    before = await event_count(owner)
    publication = json.dumps({"metadata": UPLOADED}).encode()
    pub, art = ("publication", publication), ("artifact", WEIGHTS)
    for parts, field, says in [
        ((art, art, pub), "artifact", "the 'artifact' part is given twice"),
        ((pub, pub, art), "publication", "the 'publication' part is given twice"),
        ((pub, art, art), "artifact", "the 'artifact' part is given twice"),
        ((art, pub, pub), "publication", "the 'publication' part is given twice"),
        ((pub, art, ("extra", b"x")), "extra", "a part named 'extra' is not taken"),
        ((art, pub, ("extra", b"x")), "extra", "a part named 'extra' is not taken"),
        ((("model", WEIGHTS), pub), "model", "a part named 'model' is not taken"),
        ((pub, ("model", WEIGHTS)), "model", "a part named 'model' is not taken"),
        ((art, ("model", WEIGHTS)), "model", "a part named 'model' is not taken"),
        ((pub,), "artifact", "the 'artifact' part is missing"),
        ((art,), "publication", "the 'publication' part is missing"),
        ((), "publication", "the body has no parts"),
    ]:
        response = await client.post(
            "/v1/models/m/versions", data=parts_form(*parts), headers=auth(tokens.acme)
        )
        body = await response.json()
        assert response.status == 422, (parts, body)
        assert body["field"] == field and body["error"].startswith(says), (parts, body)
    await nothing_kept(owner, before, tmp_path)
    missing = await client.get("/v1/models/m", headers=auth(tokens.acme))
    assert missing.status == 404


async def test_a_body_that_breaks_the_multipart_framing_is_refused_and_keeps_nothing(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, tmp_path: Path
) -> None:
    before = await event_count(owner)
    publication = json.dumps({"metadata": UPLOADED}).encode()
    # Framed well but for the artifact's closing boundary: the body stops after half the
    # weights, so that the bytes so far would pass for the whole artifact.
    cut = (
        b'--XX\r\nContent-Disposition: form-data; name="publication"\r\n\r\n'
        + publication
        + b'\r\n--XX\r\nContent-Disposition: form-data; name="artifact"\r\n\r\n'
        + WEIGHTS[: len(WEIGHTS) // 2]
    )
    # The artifact first: cut in it, and cut in the publication that follows it.
    artifact_first = (
        b'--XX\r\nContent-Disposition: form-data; name="artifact"\r\n\r\n'
        + WEIGHTS
        + b'\r\n--XX\r\nContent-Disposition: form-data; name="publication"\r\n\r\n'
        + publication
        + b"\r\n--XX--\r\n"
    )
    cut_artifact = artifact_first[: artifact_first.index(WEIGHTS) + len(WEIGHTS) // 2]
    cut_publication = artifact_first[: artifact_first.index(publication) + len(publication) // 2]
    for content_type, body in [
        ("multipart/form-data; boundary=XX", cut_artifact),
        ("multipart/form-data; boundary=XX", cut_publication),
        ("multipart/form-data; boundary=YY", artifact_first),
        ("multipart/form-data; boundary=XX", artifact_first.replace(b"--XX--", b"--XY--")),
        ("multipart/form-data; boundary=XX", cut),
        ("multipart/form-data", cut),  # no boundary
        ("multipart/form-data; boundary=" + "X" * 71, cut),  # longer than RFC 2046 allows
        ("multipart/form-data; boundary=YY", cut),  # a body not framed by it
        # A control character in a part's header: aiohttp's parser refuses it with an error of
        # its own, not a ValueError (schemathesis found this one as a 500).
        ("multipart/form-data; boundary=XX", cut.replace(b"form-data;", b"form-\x01data;", 1)),
    ]:
        refused = await client.post(
            "/v1/models/m/versions",
            data=body,
            headers={**auth(tokens.acme), "Content-Type": content_type},
        )
        assert refused.status == 400, (content_type, await refused.text())
    await nothing_kept(owner, before, tmp_path)
    # The whole of it, uncut, is taken.
    whole = await client.post(
        "/v1/models/m/versions",
        data=artifact_first,
        headers={**auth(tokens.acme), "Content-Type": "multipart/form-data; boundary=XX"},
    )
    assert whole.status == 201, await whole.text()


async def test_an_interrupted_upload_leaves_nothing(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, tmp_path: Path
) -> None:
    before = await event_count(owner)
    form = upload_form(WEIGHTS)
    body = await _bytes(form)
    head = (
        "POST /v1/models/cut/versions HTTP/1.1\r\n"
        f"Host: localhost\r\nAuthorization: Bearer {tokens.acme}\r\n"
        f"Content-Type: {form.content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    server = client.server
    _, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(head + body[: len(body) // 2])  # the client dies halfway through the artifact
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.transport.abort()
    await asyncio.sleep(0.5)
    assert await event_count(owner) == before
    assert blobs(tmp_path) == []
    missing = await client.get("/v1/models/cut", headers=auth(tokens.acme))
    assert missing.status == 404


async def test_an_interrupted_upload_whose_artifact_comes_first_leaves_nothing(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, tmp_path: Path
) -> None:
    before = await event_count(owner)
    form = upload_form(os.urandom(3 * CHUNK_SIZE), artifact_first=True)
    body = await _bytes(form)
    head = (
        "POST /v1/models/cut/versions HTTP/1.1\r\n"
        f"Host: localhost\r\nAuthorization: Bearer {tokens.acme}\r\n"
        f"Content-Type: {form.content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    server = client.server
    _, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(head + body[: len(body) // 2])  # the client dies halfway through the artifact
    await writer.drain()

    async def spooling() -> bool:  # in the store's staging folder, with no name there
        return len(spools(tmp_path)) == 1

    await eventually(spooling, seconds=10)
    assert blobs(tmp_path) == []
    writer.transport.abort()
    await nothing_kept(owner, before, tmp_path)
    missing = await client.get("/v1/models/cut", headers=auth(tokens.acme))
    assert missing.status == 404


async def _bytes(form: aiohttp.MultipartWriter) -> bytes:
    class Sink:
        def __init__(self) -> None:
            self.data = bytearray()

        async def write(self, chunk: bytes) -> None:
            self.data += chunk

    sink = Sink()
    await form.write(sink)  # type: ignore[arg-type]
    return bytes(sink.data)


async def test_a_damaged_artifact_is_never_downloaded_whole(
    client: Client, tokens: Tokens, tmp_path: Path
) -> None:
    view = await publish(client, tokens.acme, "m")
    (blob,) = blobs(tmp_path)
    blob.chmod(0o600)
    blob.write_bytes(WEIGHTS[:-1] + b"!")  # same size, one byte flipped
    response = await client.get("/v1/models/m/versions/1/artifact", headers=auth(tokens.acme))
    assert response.status == 200  # sent before the damage could be found
    with pytest.raises(aiohttp.ClientPayloadError):
        await response.read()
    assert view["artifact_sha256"] == hashlib.sha256(WEIGHTS).hexdigest()


async def test_aliases_updates_and_deprecation(client: Client, tokens: Tokens) -> None:
    acme = auth(tokens.acme)
    await publish(client, tokens.acme, "m", b"one")
    await publish(client, tokens.acme, "m", b"two")
    put = await client.put("/v1/models/m/aliases/production", json={"version": 1}, headers=acme)
    assert await put.json() == {"alias": "production", "version": 1, "previous": None}
    moved = await client.put("/v1/models/m/aliases/production", json={"version": 2}, headers=acme)
    assert await moved.json() == {"alias": "production", "version": 2, "previous": 1}
    same = await client.put("/v1/models/m/aliases/production", json={"version": 2}, headers=acme)
    assert (same.status, (await same.json())["previous"]) == (200, 2)
    # JSON has one number type: 2.0 is the schema's integer 2; "2" and true are not.
    integral = await client.put(
        "/v1/models/m/aliases/production", json={"version": 2.0}, headers=acme
    )
    assert (integral.status, (await integral.json())["version"]) == (200, 2)
    for version in ("2", True, 1.5):
        refused = await client.put(
            "/v1/models/m/aliases/production", json={"version": version}, headers=acme
        )
        assert refused.status == 422, version
    by_alias = await client.get("/v1/models/m/versions/production", headers=acme)
    assert (await by_alias.json())["version"] == 2
    reserved = await client.put("/v1/models/m/aliases/latest", json={"version": 1}, headers=acme)
    assert reserved.status == 422

    # Only the mutable parts change, and a recorded metric never does.
    patched = await client.patch(
        "/v1/models/m/versions/2",
        json={"tags": ["retuned"], "metrics": {"f1": 0.5}},
        headers=acme,
    )
    view = await patched.json()
    assert view["metadata"]["tags"] == ["retuned"]
    assert view["metadata"]["metrics"] == {**UPLOADED["metrics"], "f1": 0.5}
    immutable = await client.patch(
        "/v1/models/m/versions/2", json={"title": "new", "tags": "x"}, headers=acme
    )
    assert immutable.status == 422
    assert {f["field"] for f in (await immutable.json())["fields"]} == {
        "metadata.title",
        "metadata.tags",
    }
    changed = await client.patch(
        "/v1/models/m/versions/2", json={"metrics": {"f1": 0.6}}, headers=acme
    )
    assert changed.status == 409

    aliased = await client.post(
        "/v1/models/m/versions/2/deprecate", json={"reason": "old"}, headers=acme
    )
    assert aliased.status == 409
    removed = await client.delete("/v1/models/m/aliases/production", headers=acme)
    assert removed.status == 204
    gone = await client.delete("/v1/models/m/aliases/production", headers=acme)
    assert gone.status == 404
    deprecated = await client.post(
        "/v1/models/m/versions/2/deprecate", json={"reason": "superseded"}, headers=acme
    )
    assert (await deprecated.json())["deprecated"] == "superseded"

    model = await (await client.get("/v1/models/m", headers=acme)).json()
    assert [v["version"] for v in model["versions"]] == [2, 1]
    assert (model["latest"], model["aliases"]) == (1, {})
    history = await (await client.get("/v1/models/m/history", headers=acme)).json()
    assert [h["event"] for h in history["history"]] == [
        "ModelVersionPublished",
        "ModelVersionPublished",
        "ModelAliasSet",
        "ModelAliasSet",
        "ModelMetadataUpdated",
        "ModelAliasRemoved",
        "ModelVersionDeprecated",
    ]
    assert {h["actor"] for h in history["history"]} == {"tenant:acme"}


async def test_tenants_see_only_their_own_and_public_models(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    globex, admin = auth(tokens.globex), auth(tokens.admin)
    await publish(client, tokens.acme, "secret")
    await publish(client, tokens.acme, "shared", b"public weights", visibility="public")
    await publish(client, tokens.acme, "shared", b"private weights")

    for path in (
        "/v1/models/secret",
        "/v1/models/secret/versions/1",
        "/v1/models/secret/versions/1/artifact",
        "/v1/models/secret/history",
        "/v1/models/shared/versions/2",
        "/v1/models/shared/history",
    ):
        response = await client.get(path, params={"tenant": "acme"}, headers=globex)
        assert response.status == 404, path
    shared = await (
        await client.get("/v1/models/shared", params={"tenant": "acme"}, headers=globex)
    ).json()
    assert ([v["version"] for v in shared["versions"]], shared["latest"]) == ([1], 1)
    latest = await client.get(
        "/v1/models/shared/versions/latest", params={"tenant": "acme"}, headers=globex
    )
    assert (await latest.json())["version"] == 1  # the latest globex may see
    download = await client.get(
        "/v1/models/shared/versions/1/artifact", params={"tenant": "acme"}, headers=globex
    )
    assert await download.read() == b"public weights"

    # Without ?tenant= a tenant names its own models; it never writes another's.
    assert (await client.get("/v1/models/shared", headers=globex)).status == 404
    before = await event_count(owner)
    for method, path, body in [
        ("PUT", "/v1/models/shared/aliases/prod", {"version": 1}),
        ("PATCH", "/v1/models/shared/versions/1", {"tags": ["mine"]}),
        ("POST", "/v1/models/shared/versions/1/deprecate", {"reason": "no"}),
        ("DELETE", "/v1/models/shared/aliases/prod", None),
    ]:
        forbidden = await client.request(
            method, path, params={"tenant": "acme"}, json=body, headers=globex
        )
        assert forbidden.status == 403, path
        mine = await client.request(method, path, json=body, headers=globex)
        assert mine.status == 404, path
    assert await event_count(owner) == before

    found = await searched(client, tokens.globex, 1)
    assert [v["reference"] for v in found["versions"]] == ["acme/shared:1"]
    await searched(client, tokens.admin, 3)

    # The admin reads any model, naming its tenant.
    assert (await client.get("/v1/models/secret", headers=admin)).status == 400
    secret = await client.get("/v1/models/secret", params={"tenant": "acme"}, headers=admin)
    assert secret.status == 200
    for tenant in ("initech", "\x1bv"):
        nobody = await client.get("/v1/models/secret", params={"tenant": tenant}, headers=admin)
        assert nobody.status == 404
        no_tenant = await client.post(
            "/v1/models/m/versions",
            params={"tenant": tenant},
            data=upload_form(WEIGHTS),
            headers=admin,
        )
        assert (no_tenant.status, (await no_tenant.json())["field"]) == (422, "tenant")
    assert await event_count(owner) == before


async def test_publishing_from_a_job_needs_a_completed_job_of_the_tenant(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    manifest = {"name": "train", "image": "trainyard-learner:latest", "command": ["train"]}
    job = await (await client.post("/v1/jobs", json=manifest, headers=auth(tokens.acme))).json()
    before = await event_count(owner)
    body = {"metadata": UPLOADED, "from_job": job["id"]}
    queued = await client.post("/v1/models/m/versions", json=body, headers=auth(tokens.acme))
    assert queued.status == 409
    assert "QUEUED" in (await queued.json())["error"]
    foreign = await client.post("/v1/models/m/versions", json=body, headers=auth(tokens.globex))
    assert foreign.status == 404
    assert (await foreign.json())["field"] == "from_job"
    no_job = await client.post(
        "/v1/models/m/versions", json={"metadata": UPLOADED}, headers=auth(tokens.acme)
    )
    assert no_job.status == 422
    assert [f["field"] for f in (await no_job.json())["fields"]] == ["from_job"]
    # Nor does a job's publication claim a provenance: the job's events give it.
    claimed = {**body, "metadata": {**UPLOADED, "provenance": DOCUMENT["provenance"]}}
    claiming = await client.post("/v1/models/m/versions", json=claimed, headers=auth(tokens.acme))
    assert claiming.status == 422
    assert [f["field"] for f in (await claiming.json())["fields"]] == ["metadata.provenance"]
    # A job's file has no sha256 to check: the JSON body's schema leaves it out.
    checked = await client.post(
        "/v1/models/m/versions", json={**body, "sha256": "0" * 64}, headers=auth(tokens.acme)
    )
    assert checked.status == 422
    assert [f["field"] for f in (await checked.json())["fields"]] == ["sha256"]
    assert await event_count(owner) == before
