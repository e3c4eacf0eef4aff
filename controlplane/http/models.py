"""`/v1/models`: the model repository over HTTP. Search (the catalog, a read model), a model's
versions and aliases and its history (its stream: a write is read back at once), publication
by a streamed upload or from a training job, metadata updates, aliases, deprecation, download,
and the metadata's JSON Schema.

`?tenant=NAME` names the model's owner: on reads the caller's own tenant by default (another
tenant's public model when named), on writes the tenant acted for (`acting_tenant`). A model
with no version the caller may see is a 404, never a 403.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import BadHttpMessage
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, HttpUrl, StringConstraints

from controlplane.admission import gate
from controlplane.admission.policy import Room
from controlplane.artifacts.errors import (
    ArtifactCorrupted,
    ArtifactMissing,
    ArtifactTooLarge,
    ChecksumMismatch,
)
from controlplane.artifacts.store import CHUNK_SIZE
from controlplane.http import params
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.errors import error, invalid_fields
from controlplane.http.keys import MODELS, POOL, STORE, WEBHOOKS
from controlplane.http.requests import event_metadata, json_body, validated
from controlplane.models import catalog
from controlplane.models.catalog import VersionRow
from controlplane.models.errors import (
    DuplicatePublish,
    ImmutableField,
    InvalidMetadata,
    InvalidModel,
    ModelBusy,
    ModelError,
    ModelNotFound,
    SourceNotFound,
    SourceUnavailable,
    TooManyAliases,
    Unchanged,
    UnknownAlias,
    UnknownVersion,
    VersionAliased,
    VersionDeprecated,
)
from controlplane.models.events import ModelAliasSet, ModelEvent, Visibility
from controlplane.models.lifecycle import (
    MAX_REASON_CHARS,
    MODEL,
    Deprecate,
    ModelCommand,
    RemoveAlias,
    RemoveWebhook,
    SetAlias,
    SetWebhook,
    UpdateMetadata,
)
from controlplane.models.metadata import INT4_MAX, INT8_MAX, ModelMetadata, json_schema
from controlplane.models.names import LATEST, MODEL_NAME, check_model_name
from controlplane.models.query.errors import QueryError
from controlplane.models.query.query import parse
from controlplane.models.references import Reference, parse_reference, resolve
from controlplane.models.service import RESULTS_FILE, Published
from controlplane.models.state import ModelState, ModelVersion, latest
from controlplane.models.streams import model_stream
from controlplane.models.updates import MetadataUpdate, validate_update
from controlplane.models.visibility import visible_versions
from controlplane.tenants.principals import Principal
from controlplane.tenants.validation import NAME as TENANT_NAME
from controlplane.tenants.views import tenant_limits
from controlplane.webhooks.deliveries import delivery_history

MAX_PUBLICATION_BYTES = 1024 * 1024
"""The largest `publication` part of an upload: a metadata document is a few hundred KiB."""
PUBLICATION_PART, ARTIFACT_PART = "publication", "artifact"


class VersionView(BaseModel):
    """A model version as the API shows it."""

    tenant: str
    name: str
    version: int
    reference: str = Field(description="`tenant/name:version`, as the CLI and SDK take it")
    artifact_sha256: str = Field(description="the artifact's sha256 (lowercase hex)")
    size_bytes: int
    metadata: dict[str, Any] = Field(description="the metadata document, with its updates")
    metadata_schema: int = Field(description="the schema version it was validated against")
    visibility: Visibility
    deprecated: str | None = Field(description="why it was deprecated; null while it is not")
    created: datetime = Field(description="when it was published")
    published_by: str
    updated_at: datetime = Field(description="its metadata's last change (or publication)")

    @classmethod
    def of(cls, row: VersionRow) -> VersionView:
        return cls(
            tenant=row.tenant,
            name=row.name,
            version=row.version,
            reference=f"{row.tenant}/{row.name}:{row.version}",
            artifact_sha256=row.artifact_sha256,
            size_bytes=row.size_bytes,
            metadata=dict(row.metadata),
            metadata_schema=row.metadata_schema,
            visibility=Visibility(row.visibility),
            deprecated=row.deprecated,
            created=row.created,
            published_by=row.published_by,
            updated_at=row.updated_at,
        )

    @classmethod
    def of_state(cls, model: ModelState, version: ModelVersion) -> VersionView:
        return cls.of(
            VersionRow(
                tenant=model.tenant,
                name=model.name,
                version=version.number,
                artifact_sha256=version.artifact_sha256,
                size_bytes=version.size_bytes,
                metadata=version.metadata,
                metadata_schema=version.metadata_schema,
                visibility=version.visibility.value,
                deprecated=version.deprecated,
                created=version.published_at,
                published_by=version.published_by,
                updated_at=version.updated_at,
            )
        )


class Publication(BaseModel):
    """A new version: its metadata and visibility, and either an upload (the `publication`
    part of a multipart body, its `artifact` part following) or a job's results or checkpoint
    (a JSON body with `from_job`)."""

    model_config = ConfigDict(extra="forbid")

    metadata: ModelMetadata
    visibility: Visibility = Visibility.PRIVATE
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = Field(
        default=None,
        description="uploads: the artifact's sha256; the upload is refused if its bytes differ",
    )
    from_job: UUID | None = Field(
        default=None, description="publish a file of this job's results, or one of its checkpoints"
    )
    checkpoint_step: Annotated[int, Field(ge=0, le=INT8_MAX)] | None = Field(
        default=None, description="with from_job: the checkpoint saved at this step"
    )
    results_file: Annotated[str, StringConstraints(min_length=1, max_length=1000)] | None = Field(
        default=None,
        description=f"with from_job: the file of its results, relative to them ({RESULTS_FILE})",
    )


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


_STATUS: dict[type[ModelError], int] = {
    InvalidModel: 422,
    ModelNotFound: 404,
    UnknownVersion: 404,
    UnknownAlias: 404,
    SourceNotFound: 422,
    DuplicatePublish: 409,
    ImmutableField: 409,
    VersionDeprecated: 409,
    VersionAliased: 409,
    TooManyAliases: 409,
    ModelBusy: 409,
    SourceUnavailable: 409,
}


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/schemas/model-metadata", get_schema)
    app.router.add_get("/v1/models", search)
    app.router.add_get("/v1/models/{name}", get_model)
    app.router.add_get("/v1/models/{name}/history", get_history)
    app.router.add_post("/v1/models/{name}/versions", publish)
    app.router.add_get("/v1/models/{name}/versions/{version}", get_version)
    app.router.add_patch("/v1/models/{name}/versions/{version}", update_version)
    app.router.add_post("/v1/models/{name}/versions/{version}/deprecate", deprecate)
    app.router.add_get("/v1/models/{name}/versions/{version}/artifact", download)
    app.router.add_put("/v1/models/{name}/aliases/{alias}", set_alias)
    app.router.add_delete("/v1/models/{name}/aliases/{alias}", remove_alias)
    app.router.add_put("/v1/models/{name}/webhook", set_webhook)
    app.router.add_delete("/v1/models/{name}/webhook", remove_webhook)


def refused(exc: ModelError) -> web.HTTPException:
    """The HTTP answer to a model command's or look-up's refusal."""
    if isinstance(exc, InvalidMetadata):
        return invalid_fields([(f"metadata.{e.path}", e.message) for e in exc.errors], str(exc))
    # A refusal not named above is one of the model's state.
    status = next((s for kind, s in _STATUS.items() if isinstance(exc, kind)), 409)
    field = "from_job" if isinstance(exc, SourceNotFound) else None
    return error(status, str(exc), field=field)


async def get_schema(request: web.Request) -> web.Response:
    return web.json_response(json_schema())


async def search(request: web.Request) -> web.Response:
    who = principal(request)
    text = params.text(request.query.get("q", ""), "q")
    try:
        query = parse(text)
    except QueryError as exc:
        raise error(400, str(exc), field="q") from None
    limit = params.integer(request.query.get("limit"), "limit", minimum=1, maximum=catalog.MAX_PAGE)
    cursor = params.text(request.query.get("cursor"), "cursor")
    try:
        page = await catalog.search(
            request.app[POOL],
            query,
            viewer=None if who.is_admin else who.tenant,
            limit=limit or 50,
            cursor=cursor,
        )
    except InvalidModel as exc:  # only the cursor can be wrong by now
        raise error(400, str(exc), field="cursor") from None
    return web.json_response(
        {
            "versions": [_json(VersionView.of(row)) for row in page.versions],
            "total": page.total,
            "facets": page.facets,
            "next_cursor": page.next_cursor,
        }
    )


async def get_model(request: web.Request) -> web.Response:
    who = principal(request)
    model, versions = await _visible_model(request)
    numbers = {v.number for v in versions}
    newest = latest(versions)
    return web.json_response(
        {
            "tenant": model.tenant,
            "name": model.name,
            "versions": [_json(VersionView.of_state(model, v)) for v in reversed(versions)],
            # Aliases name versions; one naming a version the caller may not see is not shown.
            "aliases": {a: n for a, n in sorted(model.aliases.items()) if n in numbers},
            "latest": None if newest is None else newest.number,
            # Where the owner's notifications go is the owner's business (a URL may hold a
            # receiver's credentials).
            "webhook_url": model.webhook_url if who.may_see(model.tenant) else None,
        }
    )


async def get_history(request: web.Request) -> web.Response:
    who = principal(request)
    model, _ = await _visible_model(request)
    # The history tells of private versions too: only for the owner (and the admin).
    if not who.may_see(model.tenant):
        raise error(404, f"no history of {model.tenant}/{model.name} for you to see")
    models = request.app[MODELS]
    entries = []
    for recorded in await models.history(model.tenant, model.name):
        event: ModelEvent = MODEL.event_of(recorded)
        entries.append(
            {
                "version": recorded.stream_version,
                "position": recorded.position,
                "event": event.type_name,
                "at": event.at.isoformat(),
                "actor": recorded.metadata.actor,
                "data": event.model_dump(mode="json", exclude={"at"}),
            }
        )
    # The deliveries of its notifications, from a stream of their own (see webhooks.streams).
    deliveries = await delivery_history(request.app[STORE], model_stream(model.tenant, model.name))
    return web.json_response(
        {
            "tenant": model.tenant,
            "name": model.name,
            "history": entries,
            "webhooks": [d.model_dump(mode="json") for d in deliveries],
        }
    )


async def get_version(request: web.Request) -> web.Response:
    model, version = await _resolved(request)
    return web.json_response(_json(VersionView.of_state(model, version)))


async def download(request: web.Request) -> web.StreamResponse:
    """The artifact's bytes, checked against its sha256 as they are read: a blob found
    damaged ends the transfer before its last byte, so no client takes it for whole."""
    model, version = await _resolved(request)
    models = request.app[MODELS]
    try:
        size = await models.artifacts.size(version.artifact_sha256)
    except ArtifactMissing:
        raise error(
            409, f"the artifact of {model.tenant}/{model.name}:{version.number} is missing"
        ) from None
    digest = base64.b64encode(binascii.unhexlify(version.artifact_sha256)).decode()
    response = web.StreamResponse(
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'attachment; filename="{model.name}-v{version.number}"',
            "ETag": f'"{version.artifact_sha256}"',
            "Repr-Digest": f"sha-256=:{digest}:",
        }
    )
    response.content_length = size
    await response.prepare(request)
    # Each chunk is sent once the next has been read, and the last once the whole blob is
    # verified: a damaged blob is found only at its end, and its last chunk is then never sent.
    last = b""
    try:
        async with aclosing(models.download(version)) as chunks:
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
    tenant = await _acting(request, who, "publishes")
    name = request.match_info["name"]
    models = request.app[MODELS]
    # Room for a byte at least now; the store then stops the artifact at the room left.
    usage = await gate.admit(request.app[POOL], tenant, Room(artifact_bytes=1))
    room = usage.limits.artifact_bytes - usage.held.artifact_bytes
    try:
        check_model_name(name)
        if request.content_type == "multipart/form-data":
            published = await _upload(request, tenant, name, who, room)
        else:
            publication = validated(Publication, await json_body(request))
            if publication.from_job is None:
                raise error(
                    422,
                    "a JSON body publishes from a job (from_job); upload an artifact as "
                    f"multipart/form-data ('{PUBLICATION_PART}', then '{ARTIFACT_PART}')",
                    field="from_job",
                )
            if publication.sha256 is not None:
                raise error(422, "sha256 checks an upload, not a job's file", field="sha256")
            published = await models.publish_from_job(
                tenant,
                name,
                publication.from_job,
                publication.metadata,
                event_metadata(request, who, tenant),
                checkpoint_step=publication.checkpoint_step,
                results_file=publication.results_file or RESULTS_FILE,
                visibility=publication.visibility,
                room=room,
            )
    except ModelError as exc:
        raise refused(exc) from None
    except ArtifactTooLarge as exc:
        if exc.max_size < models.max_artifact_bytes:
            raise error(
                413,
                f"{exc}: tenant {tenant!r} holds {usage.held.artifact_bytes} bytes of model "
                f"artifacts, its artifact_bytes limit is {usage.limits.artifact_bytes}",
                field="artifact_bytes",
            ) from None
        raise error(413, str(exc), field=ARTIFACT_PART) from None
    location = f"/v1/models/{name}/versions/{published.version.number}"
    headers = {"Location": location + (f"?tenant={tenant}" if who.is_admin else "")}
    if not published.created:
        headers["Idempotent-Replayed"] = "true"
    view = VersionView.of_state(published.model, published.version)
    return web.json_response(_json(view), status=201, headers=headers)


async def _upload(
    request: web.Request, tenant: str, name: str, who: Principal, room: int
) -> Published:
    """A multipart upload: its `publication` part is checked whole before a byte of its
    `artifact` part is stored, which is streamed into the artifact store as it arrives."""
    try:
        reader = await request.multipart()
        first = await reader.next()
    except MALFORMED as exc:
        raise _malformed(exc) from None
    if not isinstance(first, BodyPartReader) or first.name != PUBLICATION_PART:
        raise error(422, f"the first part must be '{PUBLICATION_PART}'", field=PUBLICATION_PART)
    # Read up to the bound, never whole: the part is the client's to make as long as it likes.
    raw = bytearray()
    async for chunk in _chunks(first):
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
    publication = validated(Publication, document)
    if publication.from_job is not None:
        raise error(422, "an upload is not published from a job as well", field="from_job")
    if publication.checkpoint_step is not None or publication.results_file is not None:
        raise error(
            422,
            "checkpoint_step and results_file choose a file of from_job, not of an upload",
            field="checkpoint_step" if publication.checkpoint_step is not None else "results_file",
        )
    try:
        second = await reader.next()
    except MALFORMED as exc:
        raise _malformed(exc) from None
    if not isinstance(second, BodyPartReader) or second.name != ARTIFACT_PART:
        raise error(422, f"the second part must be '{ARTIFACT_PART}'", field=ARTIFACT_PART)
    models = request.app[MODELS]
    try:
        return await models.publish(
            tenant,
            name,
            _chunks(second),
            publication.metadata,
            event_metadata(request, who, tenant),
            visibility=publication.visibility,
            expected_sha256=publication.sha256,
            room=room,
        )
    except ChecksumMismatch as exc:
        raise error(422, str(exc), field="sha256") from None


async def _chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
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
    update = _update(await json_body(request))
    model, version = await _owned(request)
    command = UpdateMetadata(version.number, update, request.app[MODELS].clock.now())
    return web.json_response(_json(await _version_command(request, model, version, command)))


def _update(document: object) -> MetadataUpdate:
    try:
        return validate_update(document)
    except InvalidMetadata as exc:
        raise refused(exc) from None


async def deprecate(request: web.Request) -> web.Response:
    body = validated(DeprecateRequest, await json_body(request))
    model, version = await _owned(request)
    command = Deprecate(version.number, body.reason, request.app[MODELS].clock.now())
    return web.json_response(_json(await _version_command(request, model, version, command)))


async def set_alias(request: web.Request) -> web.Response:
    body = validated(AliasRequest, await json_body(request))
    alias = request.match_info["alias"]
    command = SetAlias(alias, body.version, request.app[MODELS].clock.now())
    _, events = await _change(request, await _owned_model(request), command)
    moved = [e for e in events if isinstance(e, ModelAliasSet)]
    # No event: it names that version already, as asked.
    previous = moved[0].previous if moved else body.version
    return web.json_response({"alias": alias, "version": body.version, "previous": previous})


async def remove_alias(request: web.Request) -> web.Response:
    command = RemoveAlias(request.match_info["alias"], request.app[MODELS].clock.now())
    await _change(request, await _owned_model(request), command)
    return web.Response(status=204)


async def set_webhook(request: web.Request) -> web.Response:
    body = validated(WebhookRequest, await json_body(request))
    model = await _owned_model(request)
    url = str(body.url)
    await request.app[WEBHOOKS].targets.admit(url, "url")
    await _change(request, model, SetWebhook(url, request.app[MODELS].clock.now()))
    return web.json_response({"url": url})


async def remove_webhook(request: web.Request) -> web.Response:
    model = await _owned_model(request)
    await _change(request, model, RemoveWebhook(request.app[MODELS].clock.now()))
    return web.Response(status=204)


async def _change(
    request: web.Request, model: ModelState, command: ModelCommand
) -> tuple[ModelState, list[ModelEvent]]:
    """Carry out `command` on the model: the model after it and the events it appended. A
    command that changes nothing answers the model as it is: it is as asked."""
    try:
        return await request.app[MODELS].execute(
            model.tenant,
            model.name,
            command,
            event_metadata(request, principal(request), model.tenant),
        )
    except Unchanged:
        return model, []
    except ModelError as exc:
        raise refused(exc) from None


async def _version_command(
    request: web.Request, model: ModelState, version: ModelVersion, command: ModelCommand
) -> VersionView:
    """Carry out a command about `version`; the version as it is then."""
    model, _ = await _change(request, model, command)
    changed = model.version(version.number)
    assert changed is not None  # versions are never removed
    return VersionView.of_state(model, changed)


def _owner(request: web.Request, who: Principal) -> str:
    """Whose model a read is about: `?tenant=`, else the caller's own."""
    named = params.text(request.query.get("tenant"), "tenant")
    if named:
        if not TENANT_NAME.fullmatch(named):
            raise error(404, f"no tenant named {named[:100]!r}", field="tenant")
        return named
    if who.tenant is None:
        raise error(400, "an admin names the model's tenant: add ?tenant=NAME", field="tenant")
    return who.tenant


async def _acting(request: web.Request, who: Principal, action: str) -> str:
    """The tenant a write acts for: the caller's own, or the tenant the admin names, which
    must exist (a model of no tenant would be no one's)."""
    tenant = acting_tenant(who, params.text(request.query.get("tenant"), "tenant"), action)
    if who.is_admin and (
        not TENANT_NAME.fullmatch(tenant) or await tenant_limits(request.app[POOL], tenant) is None
    ):
        raise error(422, f"no tenant named {tenant[:100]!r}", field="tenant")
    return tenant


def _viewer(who: Principal, owner: str) -> str:
    """Who a read sees the model as: the admin sees every version, as its owner does."""
    return owner if who.is_admin or who.tenant is None else who.tenant


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not MODEL_NAME.fullmatch(name):
        raise error(404, f"no model named {name[:100]!r}")
    return name


async def _visible_model(request: web.Request) -> tuple[ModelState, tuple[ModelVersion, ...]]:
    """The model the path names and the versions the caller may see (404 when none)."""
    who = principal(request)
    owner, name = _owner(request, who), _name(request)
    model = await request.app[MODELS].load(owner, name)
    versions = () if model is None else visible_versions(model, _viewer(who, owner))
    if model is None or not versions:
        raise error(404, f"no model {owner}/{name}")
    return model, versions


async def _resolved(request: web.Request) -> tuple[ModelState, ModelVersion]:
    """The version the path names (number, alias or `latest`), as the caller may see it."""
    who = principal(request)
    owner, name = _owner(request, who), _name(request)
    selector = request.match_info["version"]
    try:
        reference = _reference(owner, name, selector)
        return await request.app[MODELS].resolve(_viewer(who, owner), reference)
    except ModelError as exc:
        raise refused(exc) from None


def _reference(owner: str, name: str, selector: str) -> Reference:
    if selector == LATEST:
        return Reference(name=name, owner=owner)
    separator = ":" if selector.isdigit() else "@"
    try:
        return parse_reference(f"{owner}/{name}{separator}{selector}")
    except InvalidModel:
        raise UnknownVersion(f"{owner}/{name} has no version {selector[:100]!r}") from None


async def _owned_model(request: web.Request) -> ModelState:
    """The model a write is about: one of the tenant acted for (`?tenant=` for the admin)."""
    tenant = await _acting(request, principal(request), "changes models")
    name = _name(request)
    model = await request.app[MODELS].load(tenant, name)
    if model is None:
        raise error(404, f"no model {tenant}/{name}")
    return model


async def _owned(request: web.Request) -> tuple[ModelState, ModelVersion]:
    """The owned model and the version the path names in it (read once, resolved here)."""
    model = await _owned_model(request)
    try:
        reference = _reference(model.tenant, model.name, request.match_info["version"])
        return model, resolve(model, reference, model.tenant)
    except ModelError as exc:
        raise refused(exc) from None


def _json(view: VersionView) -> dict[str, Any]:
    return view.model_dump(mode="json")
