"""`/v1/models`: the model repository over HTTP. Search (the catalog, a read model), a model's
versions and aliases and its history (its stream: a write is read back at once), publication
by a streamed upload or from a training job, metadata updates, aliases, deprecation, download,
and the metadata's JSON Schema. The handlers route, authenticate and stream bytes; the model
repository's facade (`controlplane.models.application`) decides.

`?tenant=NAME` names the model's owner: on reads the caller's own tenant by default (another
tenant's public model when named), on writes the tenant acted for (`acting_tenant`). A model
with no version the caller may see is a 404, never a 403.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Annotated, BinaryIO

from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.http_exceptions import BadHttpMessage
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, HttpUrl, StringConstraints

from controlplane.artifacts.errors import ArtifactCorrupted, ArtifactTooLarge
from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.artifacts.store import CHUNK_SIZE, ArtifactStore
from controlplane.artifacts.thread import FileThread
from controlplane.http import params, query
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.errors import error
from controlplane.http.keys import PLANE
from controlplane.http.operations import REF, Answer, Operation, Param, add_operations, answer
from controlplane.http.requests import event_metadata, json_body, validated
from controlplane.models.application import (
    ModelsApplication,
    Publishing,
    metadata_update,
)
from controlplane.models.catalog import MAX_PAGE
from controlplane.models.lifecycle import MAX_REASON_CHARS
from controlplane.models.metadata import INT4_MAX
from controlplane.models.names import ALIAS, LATEST, MODEL_NAME
from controlplane.models.publication import (
    ARTIFACT_PART,
    PUBLICATION_PART,
    JobPublication,
    UploadPublication,
)
from controlplane.models.query.tokens import ADMITTED
from controlplane.models.updates import MetadataUpdate
from controlplane.models.views import (
    AliasView,
    ModelHistory,
    ModelView,
    VersionPage,
    VersionView,
    WebhookView,
)
from controlplane.tenants.principals import Principal

MODELS_APPLICATION = web.AppKey("models_application", ModelsApplication)

MAX_PUBLICATION_BYTES = 1024 * 1024
"""The largest `publication` part of an upload: a metadata document is a few hundred KiB."""


def _integral(value: object) -> object:
    """2.0 as 2: JSON has one number type, and the schema's `integer` admits 2.0 (strict, so
    that "2" and true stay refused)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class AliasRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Annotated[int, Field(strict=True, ge=1, le=INT4_MAX), BeforeValidator(_integral)]


class WebhookRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: HttpUrl = Field(
        description="where the model's events are POSTed, signed as a job's notifications are"
    )


class DeprecateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON_CHARS)]


class OwnerQuery(query.Query):
    tenant: Annotated[str | None, query.text()] = Field(
        default=None,
        description="the model's tenant (default: the caller's own; the admin must name it)",
    )


class ActingQuery(query.Query):
    tenant: Annotated[str | None, query.text()] = Field(
        default=None, description="admins only: the tenant whose model it is"
    )


QUERY_FORMAT = "model-query"
"""The format the document names for the search language: a grammar, which no pattern states."""


class SearchQuery(query.Query):
    q: Annotated[
        str,
        query.text(schema={**params.text_schema(), "pattern": ADMITTED, "format": QUERY_FORMAT}),
    ] = Field(
        default="",
        description="the query, in the model search language (format model-query: terms such "
        'as resnet, "two words", name~res, framework:pytorch, metrics.accuracy>=0.9, '
        "version>=3, created<2026-12-01, with AND, OR, NOT or -, and parentheses; the user "
        "guide's 'Model search queries' gives the grammar; anything else is a 400 naming q); "
        "empty: every version",
    )
    limit: Annotated[int, query.integer(1, MAX_PAGE)] = Field(
        default=50, description="page size (default 50)"
    )
    cursor: Annotated[str | None, query.text(schema=params.CURSOR_SCHEMA)] = Field(
        default=None, description="next_cursor of the previous page"
    )


def _facade(request: web.Request) -> ModelsApplication:
    return request.app[MODELS_APPLICATION]


async def get_schema(request: web.Request) -> web.Response:
    return web.json_response(_facade(request).metadata_schema())


async def search(request: web.Request) -> web.Response:
    who = principal(request)
    asked = query.parsed(request, SearchQuery)
    page = await _facade(request).search(who, asked.q, limit=asked.limit, cursor=asked.cursor)
    return answer(page)


async def get_model(request: web.Request) -> web.Response:
    who = principal(request)
    owner = query.parsed(request, OwnerQuery).tenant
    return answer(await _facade(request).model(who, owner, request.match_info["name"]))


async def get_history(request: web.Request) -> web.Response:
    who = principal(request)
    owner = query.parsed(request, OwnerQuery).tenant
    return answer(await _facade(request).history(who, owner, request.match_info["name"]))


async def get_version(request: web.Request) -> web.Response:
    who = principal(request)
    owner = query.parsed(request, OwnerQuery).tenant
    name, selector = request.match_info["name"], request.match_info["version"]
    return answer(await _facade(request).version(who, owner, name, selector))


async def download(request: web.Request) -> web.StreamResponse:
    """The artifact's bytes, checked against its sha256 as they are read: a blob found
    damaged ends the transfer before its last byte, so no client takes it for whole."""
    who = principal(request)
    owner = query.parsed(request, OwnerQuery).tenant
    name, selector = request.match_info["name"], request.match_info["version"]
    facade = _facade(request)
    artifact = await facade.artifact(who, owner, name, selector)
    response = web.StreamResponse(
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'attachment; filename="{artifact.filename}"',
            "ETag": f'"{artifact.sha256}"',
            "Repr-Digest": f"sha-256=:{artifact.digest}:",
        }
    )
    response.content_length = artifact.size
    await response.prepare(request)
    # Each chunk is sent once the next has been read, and the last once the whole blob is
    # verified: a damaged blob is found only at its end, and its last chunk is then never sent.
    last = b""
    try:
        async with aclosing(facade.read(artifact)) as chunks:
            async for chunk in chunks:
                await response.write(last)
                last = chunk
    except ArtifactCorrupted:
        # The status is sent: what is left is not to finish the body. A connection closed
        # before Content-Length is reached tells the client the body is cut.
        if request.transport is not None:
            request.transport.close()
        return response
    await response.write(last)
    await response.write_eof()
    return response


async def publish(request: web.Request) -> web.Response:
    who = principal(request)
    tenant = acting_tenant(who, query.parsed(request, ActingQuery).tenant, "publishes")
    facade = _facade(request)
    publishing = await facade.publishing(who, tenant, request.match_info["name"])
    if request.content_type == "multipart/form-data":
        view, created = await _upload(request, facade, publishing, who)
    else:
        publication = validated(JobPublication, await json_body(request))
        metadata = event_metadata(request, who, tenant)
        view, created = await facade.publish_from_job(publishing, publication, metadata)
    location = f"/v1/models/{publishing.name}/versions/{view.version}"
    headers = {"Location": location + (f"?tenant={tenant}" if who.is_admin else "")}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return answer(view, status=201, headers=headers)


async def _upload(
    request: web.Request, facade: ModelsApplication, publishing: Publishing, who: Principal
) -> tuple[VersionView, bool]:
    """A multipart upload: its two parts, `publication` and `artifact`, in either order (the
    OpenAPI document cannot state one, so none is asked for).

    `publication` first: it is checked whole before a byte of the artifact is stored, which
    is streamed into the artifact store as it arrives. `artifact` first: its bytes are held
    in a spool file (in the store's staging folder), stopped at the size limit the store
    would stop them at, until `publication` is read and checked as on the other path; then
    they are stored from the spool. A part of another name, one given twice or missing is
    refused, and nothing is kept."""
    try:
        reader = await request.multipart()
    except MALFORMED as exc:
        raise _malformed(exc) from None
    first = await _next(reader)
    if first is None:
        raise error(
            422,
            f"the body has no parts: an upload is '{PUBLICATION_PART}' and '{ARTIFACT_PART}'",
            field=PUBLICATION_PART,
        )
    if not isinstance(first, BodyPartReader) or first.name not in (PUBLICATION_PART, ARTIFACT_PART):
        raise _unexpected(first, PUBLICATION_PART)
    if first.name == PUBLICATION_PART:
        publication = await _publication(first)
        artifact = await _part(reader, ARTIFACT_PART)
        metadata = event_metadata(request, who, publishing.tenant)
        chunks = _then_end(_chunks(artifact), reader)
        return await facade.publish_upload(publishing, publication, chunks, metadata)
    async with _Spool(facade.models.artifacts) as spool:
        await spool.fill(_chunks(first), publishing)
        publication = await _publication(await _part(reader, PUBLICATION_PART))
        await _end(reader)
        metadata = event_metadata(request, who, publishing.tenant)
        return await facade.publish_upload(publishing, publication, spool.chunks(), metadata)


async def _publication(part: BodyPartReader) -> UploadPublication:
    """The `publication` part, read up to its bound (never whole: the part is the client's to
    make as long as it likes), parsed and validated."""
    raw = bytearray()
    async for chunk in _chunks(part):
        raw += chunk
        if len(raw) > MAX_PUBLICATION_BYTES:
            raise error(
                413,
                f"'{PUBLICATION_PART}' is over {MAX_PUBLICATION_BYTES} bytes",
                field=PUBLICATION_PART,
            )
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise error(400, f"malformed JSON in '{PUBLICATION_PART}': {exc}") from None
    return validated(UploadPublication, document)


Part = MultipartReader | BodyPartReader | None
"""What `MultipartReader.next` answers: a part, a nested multipart body, or None at the end."""


async def _next(reader: MultipartReader) -> Part:
    try:
        return await reader.next()
    except MALFORMED as exc:
        raise _malformed(exc) from None


async def _part(reader: MultipartReader, wanted: str) -> BodyPartReader:
    """The next part, which must be `wanted` (the other one came already)."""
    part = await _next(reader)
    if part is None:
        raise error(422, f"the '{wanted}' part is missing", field=wanted)
    if not isinstance(part, BodyPartReader) or part.name != wanted:
        raise _unexpected(part, wanted)
    return part


async def _end(reader: MultipartReader) -> None:
    """The body's end: both parts came, and no other may follow."""
    part = await _next(reader)
    if part is not None:
        raise _unexpected(part, None)


async def _then_end(
    chunks: AsyncGenerator[bytes, None], reader: MultipartReader
) -> AsyncIterator[bytes]:
    """`chunks`, then the body's end checked: inside the stream the store writes, so that a
    part after the artifact fails the write before its blob is kept."""
    async with aclosing(chunks):
        async for chunk in chunks:
            yield chunk
    await _end(reader)


def _unexpected(part: MultipartReader | BodyPartReader, wanted: str | None) -> web.HTTPException:
    """The refusal of a part where the upload takes `wanted` (None: no more parts): one it
    has already, or one it never takes (named in `field`; a part with no name as `wanted`)."""
    name = part.name if isinstance(part, BodyPartReader) else None
    if name in (PUBLICATION_PART, ARTIFACT_PART):
        return error(422, f"the '{name}' part is given twice", field=name)
    what = f"a part named {name[:80]!r}" if name else "a part with no name"
    return error(
        422,
        f"{what} is not taken: an upload is two parts, '{PUBLICATION_PART}' and "
        f"'{ARTIFACT_PART}', in either order",
        field=name[:80] if name else (wanted or ARTIFACT_PART),
    )


class _Spool:
    """An artifact that came before its publication, held in a file until the publication is
    checked: in the file store's staging folder (else the system's temporary one), a file with
    no name (`tempfile.TemporaryFile`), so that nothing is left of it once it is closed, and
    nothing even when the server is killed. Its calls run in a thread of its own, one after
    another, the last one (closing it) also when the upload is refused or cancelled."""

    def __init__(self, store: ArtifactStore) -> None:
        self._staging = store.staging if isinstance(store, FileArtifactStore) else None
        self._thread = FileThread()
        self._file: BinaryIO | None = None

    async def __aenter__(self) -> _Spool:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._thread.finish(self._close)

    def _open(self) -> None:
        directory = None if self._staging is None else self._staging()
        self._file = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115 (closed in _close)

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()

    def _write(self, chunk: bytes) -> None:
        assert self._file is not None
        self._file.write(chunk)

    def _read(self) -> bytes:
        assert self._file is not None
        return self._file.read(CHUNK_SIZE)

    async def fill(self, chunks: AsyncGenerator[bytes, None], publishing: Publishing) -> None:
        """Hold `chunks`, refused as the store refuses an artifact past its size limit (the
        server's, or the room the tenant's limit leaves, as `Models.publish` bounds the write):
        with the same answer, before a byte past it is written."""
        bound = min(publishing.room, publishing.max_artifact_bytes)
        size = 0
        await self._thread.run(self._open)
        async with aclosing(chunks):
            async for chunk in chunks:
                size += len(chunk)
                if size > bound:
                    with publishing.refusing():
                        raise ArtifactTooLarge(bound)
                await self._thread.run(self._write, chunk)
        await self._thread.run(self._rewind)

    def _rewind(self) -> None:
        assert self._file is not None
        self._file.flush()
        self._file.seek(0)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The bytes held, read back in the spool's thread a chunk at a time."""
        while chunk := await self._thread.run(self._read):
            yield chunk


async def _chunks(part: BodyPartReader) -> AsyncGenerator[bytes, None]:
    """The part's bytes as they arrive; a 400 when the body breaks the multipart framing,
    also when it ends before the part's closing boundary (a body cut short, but cut where
    nothing else notices: without it, the bytes so far would pass for the whole artifact)."""
    try:
        while chunk := await part.read_chunk(CHUNK_SIZE):
            yield chunk
    except MALFORMED as exc:
        raise _malformed(exc) from None
    if not part.at_eof():
        raise error(
            400,
            f"the '{part.name}' part ended before its closing boundary: the body was cut short; "
            "nothing was kept",
            field=part.name,
        )


MALFORMED = (ValueError, AssertionError, KeyError, BadHttpMessage)
"""What aiohttp's multipart reader raises on a body that breaks the framing (no boundary, one
too long, a part that does not start with it; its asserts check the client's input) or holds
a part header its parser refuses (a control character: InvalidHeader)."""


def _malformed(exc: Exception) -> web.HTTPException:
    return error(400, f"malformed multipart/form-data body: {exc or type(exc).__name__}")


async def update_version(request: web.Request) -> web.Response:
    update = metadata_update(await json_body(request))
    who, tenant = _acting(request)
    name, selector = request.match_info["name"], request.match_info["version"]
    metadata = event_metadata(request, who, tenant)
    view = await _facade(request).update(who, tenant, name, selector, update, metadata)
    return answer(view)


async def deprecate(request: web.Request) -> web.Response:
    body = validated(DeprecateRequest, await json_body(request))
    who, tenant = _acting(request)
    name, selector = request.match_info["name"], request.match_info["version"]
    metadata = event_metadata(request, who, tenant)
    view = await _facade(request).deprecate(who, tenant, name, selector, body.reason, metadata)
    return answer(view)


async def set_alias(request: web.Request) -> web.Response:
    body = validated(AliasRequest, await json_body(request))
    who, tenant = _acting(request)
    name, alias = request.match_info["name"], request.match_info["alias"]
    metadata = event_metadata(request, who, tenant)
    return answer(
        await _facade(request).set_alias(who, tenant, name, alias, body.version, metadata)
    )


async def remove_alias(request: web.Request) -> web.Response:
    who, tenant = _acting(request)
    name, alias = request.match_info["name"], request.match_info["alias"]
    metadata = event_metadata(request, who, tenant)
    await _facade(request).remove_alias(who, tenant, name, alias, metadata)
    return web.Response(status=204)


async def set_webhook(request: web.Request) -> web.Response:
    body = validated(WebhookRequest, await json_body(request))
    who, tenant = _acting(request)
    metadata = event_metadata(request, who, tenant)
    name = request.match_info["name"]
    return answer(await _facade(request).set_webhook(who, tenant, name, str(body.url), metadata))


async def remove_webhook(request: web.Request) -> web.Response:
    who, tenant = _acting(request)
    metadata = event_metadata(request, who, tenant)
    await _facade(request).remove_webhook(who, tenant, request.match_info["name"], metadata)
    return web.Response(status=204)


def _acting(request: web.Request) -> tuple[Principal, str]:
    """Who asks, and the tenant whose model the write changes."""
    who = principal(request)
    return who, acting_tenant(who, query.parsed(request, ActingQuery).tenant, "changes models")


_REASONS = {
    400: "malformed request: a parameter or JSON body (the field names which)",
    401: "missing or wrong token",
    403: "a tenant's token acting for another tenant",
    404: "no such model, version or alias (or none the caller may see)",
    409: "refused in the model's current state (the message says why)",
    413: "the artifact (or its publication part) is over the size limit; nothing kept",
    422: "invalid fields, each listed (metadata fields as metadata.<path>)",
    429: "a tenant limit reached (the field names which; see docs/user-guide.md, Limits); "
    "nothing kept",
}


def _errors(*statuses: int, **reasons: str) -> dict[int, str]:
    """Error answers; `e409="..."` says what a status means for one operation."""
    return {s: reasons.get(f"e{s}", _REASONS[s]) for s in statuses}


NAME = Param(
    "name", "path", "the model's name", {"type": "string", "pattern": f"^{MODEL_NAME.pattern}$"}
)
VERSION = Param("version", "path", "a version number, an alias, or latest", {"type": "string"})
ALIAS_PARAM = Param(
    "alias",
    "path",
    f"the alias (not {LATEST}, which is derived)",
    {"type": "string", "pattern": f"^(?!{LATEST}$){ALIAS.pattern}$"},
)
UPLOAD = {
    "type": "object",
    "properties": {
        PUBLICATION_PART: {"$ref": REF + "UploadPublication"},
        ARTIFACT_PART: {"type": "string", "format": "binary"},
    },
    "required": [PUBLICATION_PART, ARTIFACT_PART],
    "additionalProperties": False,
    "description": f"exactly two parts, `{PUBLICATION_PART}` and `{ARTIFACT_PART}`, in either "
    "order",
}
OPERATIONS = (
    Operation(
        "get",
        "/v1/schemas/model-metadata",
        get_schema,
        "getModelMetadataSchema",
        "The model metadata's JSON Schema (draft 2020-12)",
        {200: Answer("the schema", {"type": "object"})},
        _errors(401),
    ),
    Operation(
        "get",
        "/v1/models",
        search,
        "searchModels",
        "Search the model versions the caller may see (docs/user-guide.md: Model search "
        "queries): ranked, with the total, facet counts and a cursor",
        {200: Answer("a page", VersionPage)},
        _errors(400, 401),
        query=SearchQuery,
    ),
    Operation(
        "get",
        "/v1/models/{name}",
        get_model,
        "getModel",
        "A model's versions (those the caller may see) and aliases",
        {200: Answer("the model", ModelView)},
        _errors(400, 401, 404),
        query=OwnerQuery,
        params=(NAME,),
    ),
    Operation(
        "get",
        "/v1/models/{name}/history",
        get_history,
        "getModelHistory",
        "Every event of the model, with its time and actor (its tenant and the admin only)",
        {200: Answer("the history", ModelHistory)},
        _errors(400, 401, 404),
        query=OwnerQuery,
        params=(NAME,),
    ),
    Operation(
        "post",
        "/v1/models/{name}/versions",
        publish,
        "publishModelVersion",
        "Publish the model's next version: an upload, or a job's file",
        {201: Answer("the version", VersionView)},
        _errors(
            400,
            401,
            403,
            404,
            409,
            413,
            422,
            429,
            e403="a tenant's token acting for another tenant; or an artifact that alone is "
            "over its tenant's artifact_bytes limit",
            e404="no such job of the tenant (field from_job), or no checkpoint of it at that "
            "step (field checkpoint_step)",
            e409="the job has not COMPLETED, or its file is gone",
            e413="the artifact is over the size limit, or over the room its tenant's "
            "artifact_bytes limit leaves (field artifact_bytes); nothing kept",
            e422="invalid fields, each listed; a bad model name; an upload whose bytes do not "
            "have its sha256",
        ),
        description=f"multipart/form-data: the `{PUBLICATION_PART}` part (JSON) and the "
        f"`{ARTIFACT_PART}` part, in either order. `{PUBLICATION_PART}` first is checked before "
        f"the artifact is read, which is then streamed into the store; `{ARTIFACT_PART}` first "
        "is held aside (up to the same size limit) until the publication is checked, then "
        "stored. The artifact is checked against `sha256` when given. application/json: "
        "`from_job` with "
        "`checkpoint_step` or `results_file`; the provenance is filled in from the job's "
        "events. Publishing the same bytes and metadata again answers with the version it made "
        "(Idempotent-Replayed).",
        query=ActingQuery,
        params=(NAME,),
        raw_body={
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": UPLOAD,
                    "encoding": {PUBLICATION_PART: {"contentType": "application/json"}},
                },
                "application/json": {"schema": {"$ref": REF + "JobPublication"}},
            },
        },
        raw_body_models=(UploadPublication, JobPublication),
    ),
    Operation(
        "get",
        "/v1/models/{name}/versions/{version}",
        get_version,
        "getModelVersion",
        "One version of a model",
        {200: Answer("the version", VersionView)},
        _errors(400, 401, 404),
        query=OwnerQuery,
        params=(NAME, VERSION),
    ),
    Operation(
        "patch",
        "/v1/models/{name}/versions/{version}",
        update_version,
        "updateModelVersion",
        "Change a version's mutable metadata (description, domains, tags, citation; metrics added)",
        {200: Answer("the version (also when nothing changed)", VersionView)},
        _errors(
            400,
            401,
            403,
            404,
            409,
            422,
            e409="a recorded metric given another value",
            e422="invalid or immutable fields, each listed",
        ),
        query=ActingQuery,
        params=(NAME, VERSION),
        body=MetadataUpdate,
        body_required=True,
    ),
    Operation(
        "post",
        "/v1/models/{name}/versions/{version}/deprecate",
        deprecate,
        "deprecateModelVersion",
        "Deprecate a version: no longer latest, no alias may name it",
        {200: Answer("the version", VersionView)},
        _errors(400, 401, 403, 404, 409, 422, e409="an alias names the version"),
        query=ActingQuery,
        params=(NAME, VERSION),
        body=DeprecateRequest,
        body_required=True,
    ),
    Operation(
        "get",
        "/v1/models/{name}/versions/{version}/artifact",
        download,
        "downloadModelVersion",
        "The version's artifact, verified against its sha256 as it is read",
        {
            200: Answer(
                "the artifact's bytes",
                {"type": "string", "format": "binary"},
                media="application/octet-stream",
            )
        },
        _errors(400, 401, 404, 409, e409="the artifact is missing from the store"),
        description="ETag and Repr-Digest carry the sha256. A stored artifact found damaged is "
        "never sent whole: the connection closes before its last bytes.",
        query=OwnerQuery,
        params=(NAME, VERSION),
    ),
    Operation(
        "put",
        "/v1/models/{name}/webhook",
        set_webhook,
        "setModelWebhook",
        "Notify the model's events to a URL (see the document's webhooks)",
        {200: Answer("the webhook", WebhookView)},
        _errors(
            400,
            401,
            403,
            404,
            409,
            422,
            e403="a tenant's token acting for another tenant; or a host that is or resolves to "
            "a non-public address (not in TRAINYARD_WEBHOOK_ALLOW_NETWORKS), or does not "
            "resolve (field url)",
            e422="invalid fields",
        ),
        description="Each ModelVersionPublished, ModelMetadataUpdated, ModelAliasSet, "
        "ModelAliasRemoved and ModelVersionDeprecated from now on is POSTed to it, signed with "
        "the tenant's webhook secret and retried as a job's notifications are.",
        query=ActingQuery,
        params=(NAME,),
        body=WebhookRequest,
        body_required=True,
    ),
    Operation(
        "delete",
        "/v1/models/{name}/webhook",
        remove_webhook,
        "removeModelWebhook",
        "Stop notifying the model's events",
        {204: Answer("removed (or there was none)")},
        _errors(400, 401, 403, 404, 409, 422, e422="an unknown tenant"),
        query=ActingQuery,
        params=(NAME,),
    ),
    Operation(
        "put",
        "/v1/models/{name}/aliases/{alias}",
        set_alias,
        "setModelAlias",
        "Point an alias at a version (a new alias, or moved: one event)",
        {200: Answer("the alias", AliasView)},
        _errors(
            400,
            401,
            403,
            404,
            409,
            422,
            e409="the version is deprecated, or the model has its most aliases",
            e422="invalid fields; an invalid alias, or latest (derived)",
        ),
        query=ActingQuery,
        params=(NAME, ALIAS_PARAM),
        body=AliasRequest,
        body_required=True,
    ),
    Operation(
        "delete",
        "/v1/models/{name}/aliases/{alias}",
        remove_alias,
        "removeModelAlias",
        "Remove an alias",
        {204: Answer("removed")},
        _errors(400, 401, 403, 404, 422, e422="an invalid alias, or latest"),
        query=ActingQuery,
        params=(NAME, ALIAS_PARAM),
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
    app.on_startup.append(_open)


async def _open(app: web.Application) -> None:
    # After the composition root's parts are open (cleanup contexts start first).
    plane = app[PLANE]
    app[MODELS_APPLICATION] = ModelsApplication(
        plane.models, plane.pool, plane.store, webhook_targets=plane.webhooks.targets
    )
