"""The model repository as its front ends use it: search, read a model, its history, a version
and its artifact; publish (an upload or a job's file), update and deprecate a version, set and
remove aliases and the model's webhook.

A facade in the sense of eventsourcing's Application: it takes requests already parsed (the
HTTP layer routes, authenticates and streams the bytes, nothing more), decides whose model a
request is about and what the caller may see of it, checks the tenant's limits before anything
is written, runs commands through the `Models` service, and answers with the views its readers
get (`models.views`). What it refuses it raises as a `Refusal`.

Whose model: a read names its owner (`owner`; the caller's own tenant when None, another
tenant's public model when named), a write the tenant it acts for (`tenant`, which an admin
names and which must then exist). A model with no version the caller may see is not found,
never forbidden.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg

from controlplane.admission import gate
from controlplane.admission.policy import Room
from controlplane.admission.usage import Usage
from controlplane.artifacts.errors import ArtifactMissing, ArtifactTooLarge, ChecksumMismatch
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.models import catalog
from controlplane.models.errors import (
    InvalidMetadata,
    InvalidModel,
    ModelError,
    ModelNotFound,
    SourceNotFound,
    Unchanged,
    UnknownAlias,
    UnknownVersion,
)
from controlplane.models.events import ModelAliasSet, ModelEvent
from controlplane.models.lifecycle import (
    MODEL,
    Deprecate,
    ModelCommand,
    RemoveAlias,
    RemoveWebhook,
    SetAlias,
    SetWebhook,
    UpdateMetadata,
)
from controlplane.models.metadata import json_schema
from controlplane.models.names import LATEST, MODEL_NAME, check_model_name
from controlplane.models.publication import ARTIFACT_PART, JobPublication, UploadPublication
from controlplane.models.query.errors import QueryError
from controlplane.models.query.query import parse
from controlplane.models.references import Reference, parse_reference, resolve
from controlplane.models.service import RESULTS_FILE, Models, Published
from controlplane.models.state import ModelState, ModelVersion, latest
from controlplane.models.streams import model_stream
from controlplane.models.updates import MetadataUpdate, validate_update
from controlplane.models.views import (
    AliasView,
    Artifact,
    ModelHistory,
    ModelHistoryEntry,
    ModelView,
    VersionPage,
    VersionView,
    WebhookView,
)
from controlplane.models.visibility import visible_versions
from controlplane.refusals import Refusal, Refused
from controlplane.tenants.principals import Principal
from controlplane.tenants.validation import NAME as TENANT_NAME
from controlplane.tenants.views import tenant_limits
from controlplane.webhooks.deliveries import delivery_history
from controlplane.webhooks.targets import CheckingResolver

_KINDS: tuple[tuple[type[ModelError], Refused], ...] = (
    (InvalidModel, Refused.INVALID),
    # Named in the body, as a model version may be: a 404 naming the field.
    (SourceNotFound, Refused.NOT_FOUND),
    (ModelNotFound, Refused.NOT_FOUND),
    (UnknownVersion, Refused.NOT_FOUND),
    (UnknownAlias, Refused.NOT_FOUND),
)
"""The kind of each of the service's refusals; any other is one of the model's state."""


def refusal(exc: ModelError) -> Refusal:
    """The refusal that says a model command's or look-up's error."""
    if isinstance(exc, InvalidMetadata):
        fields = [(f"metadata.{e.path}", e.message) for e in exc.errors]
        return Refusal(Refused.INVALID, str(exc), fields=fields)
    kind = next((k for cls, k in _KINDS if isinstance(exc, cls)), Refused.CONFLICT)
    return Refusal(kind, str(exc), field=exc.field if isinstance(exc, SourceNotFound) else None)


def _published(published: Published) -> tuple[VersionView, bool]:
    return VersionView.of_state(published.model, published.version), published.created


def metadata_update(document: object) -> MetadataUpdate:
    """A JSON document as a metadata update: every bad field named, each immutable one said
    to be so."""
    try:
        return validate_update(document)
    except InvalidMetadata as exc:
        raise refusal(exc) from None


class Publishing:
    """A publication admitted: the model it adds a version to, and the room its artifact may
    take (the store stops it there)."""

    def __init__(self, tenant: str, name: str, usage: Usage, *, max_artifact_bytes: int) -> None:
        self.tenant = tenant
        self.name = name
        self.usage = usage
        self.max_artifact_bytes = max_artifact_bytes
        """The server's limit on any artifact."""
        self.room = usage.limits.artifact_bytes - usage.held.artifact_bytes
        """The most bytes the artifact may take: what the tenant's artifact_bytes limit leaves."""

    @contextmanager
    def refusing(self) -> Iterator[None]:
        """The publication's errors as refusals: an artifact past the server's limit or past
        the room the tenant's limit leaves (which one is said), bytes that are not the sha256
        the upload gave, and the service's refusals."""
        try:
            yield
        except ModelError as exc:
            raise refusal(exc) from None
        except ChecksumMismatch as exc:
            raise Refusal(Refused.INVALID, str(exc), field="sha256") from None
        except ArtifactTooLarge as exc:
            if exc.max_size < self.max_artifact_bytes:
                raise Refusal(
                    Refused.TOO_LARGE,
                    f"{exc}: tenant {self.tenant!r} holds {self.usage.held.artifact_bytes} bytes "
                    f"of model artifacts, its artifact_bytes limit is "
                    f"{self.usage.limits.artifact_bytes}",
                    field="artifact_bytes",
                ) from None
            raise Refusal(Refused.TOO_LARGE, str(exc), field=ARTIFACT_PART) from None


class ModelsApplication:
    def __init__(
        self,
        models: Models,
        pool: asyncpg.Pool,
        store: EventStore,
        *,
        webhook_targets: CheckingResolver,
    ) -> None:
        self.models = models
        self._pool = pool
        self._store = store
        self._webhook_targets = webhook_targets

    @staticmethod
    def metadata_schema() -> dict[str, Any]:
        """The metadata document's JSON Schema (draft 2020-12)."""
        return json_schema()

    async def search(
        self, who: Principal, text: str, *, limit: int, cursor: str | None
    ) -> VersionPage:
        """The versions `who` may see that the query `text` matches (an empty one: every
        version), ranked; at most `limit`, from `cursor`."""
        try:
            query = parse(text)
        except QueryError as exc:
            raise Refusal(Refused.MALFORMED, str(exc), field="q") from None
        try:
            page = await catalog.search(
                self._pool,
                query,
                viewer=None if who.is_admin else who.tenant,
                limit=limit,
                cursor=cursor,
            )
        except InvalidModel as exc:  # the limit is the caller's to check: only the cursor
            raise Refusal(Refused.MALFORMED, str(exc), field="cursor") from None
        return VersionPage(
            versions=[VersionView.of(row) for row in page.versions],
            total=page.total,
            facets=page.facets,
            next_cursor=page.next_cursor,
        )

    async def model(self, who: Principal, owner: str | None, name: str) -> ModelView:
        model, versions = await self._visible(who, owner, name)
        numbers = {v.number for v in versions}
        newest = latest(versions)
        return ModelView(
            tenant=model.tenant,
            name=model.name,
            versions=[VersionView.of_state(model, v) for v in reversed(versions)],
            # Aliases name versions; one naming a version the caller may not see is not shown.
            aliases={a: n for a, n in sorted(model.aliases.items()) if n in numbers},
            latest=None if newest is None else newest.number,
            # Where the owner's notifications go is the owner's business (a URL may hold a
            # receiver's credentials).
            webhook_url=model.webhook_url if who.may_see(model.tenant) else None,
        )

    async def history(self, who: Principal, owner: str | None, name: str) -> ModelHistory:
        model, _ = await self._visible(who, owner, name)
        # The history tells of private versions too: only for the owner (and the admin).
        if not who.may_see(model.tenant):
            raise Refusal(
                Refused.NOT_FOUND, f"no history of {model.tenant}/{model.name} for you to see"
            )
        entries = []
        for recorded in await self.models.history(model.tenant, model.name):
            event: ModelEvent = MODEL.event_of(recorded)
            entries.append(
                ModelHistoryEntry(
                    version=recorded.stream_version,
                    position=recorded.position,
                    event=event.type_name,
                    at=event.at,
                    actor=recorded.metadata.actor,
                    data=event.model_dump(mode="json", exclude={"at"}),
                )
            )
        # The deliveries of its notifications, from a stream of their own (see webhooks.streams).
        deliveries = await delivery_history(self._store, model_stream(model.tenant, model.name))
        return ModelHistory(
            tenant=model.tenant, name=model.name, history=entries, webhooks=deliveries
        )

    async def version(
        self, who: Principal, owner: str | None, name: str, selector: str
    ) -> VersionView:
        """The version `selector` names (a number, an alias or `latest`), as `who` sees it."""
        return VersionView.of_state(*await self._resolved(who, owner, name, selector))

    async def artifact(
        self, who: Principal, owner: str | None, name: str, selector: str
    ) -> Artifact:
        """The artifact of the version `selector` names, found in the store."""
        model, version = await self._resolved(who, owner, name, selector)
        try:
            size = await self.models.artifacts.size(version.artifact_sha256)
        except ArtifactMissing:
            raise Refusal(
                Refused.CONFLICT,
                f"the artifact of {model.tenant}/{model.name}:{version.number} is missing",
            ) from None
        return Artifact(model, version, size)

    def read(self, artifact: Artifact) -> AsyncGenerator[bytes, None]:
        """The artifact's bytes, checksum verified as they are read (ArtifactCorrupted at the
        end when the stored bytes changed)."""
        return self.models.download(artifact.version)

    async def publishing(self, who: Principal, tenant: str, name: str) -> Publishing:
        """A publication of the model `name` of `tenant` admitted: room for a byte at least
        now (the store then stops the artifact at the room left), and a valid name."""
        await self._acting(who, tenant)
        usage = await gate.admit(self._pool, tenant, Room(artifact_bytes=1))
        try:
            check_model_name(name)
        except ModelError as exc:
            raise refusal(exc) from None
        return Publishing(tenant, name, usage, max_artifact_bytes=self.models.max_artifact_bytes)

    async def publish_upload(
        self,
        publishing: Publishing,
        publication: UploadPublication,
        chunks: AsyncIterable[bytes],
        metadata: Metadata,
    ) -> tuple[VersionView, bool]:
        """The version an upload made of `chunks`, streamed into the store, and whether it
        is new (False: the same bytes and metadata again)."""
        with publishing.refusing():
            published = await self.models.publish(
                publishing.tenant,
                publishing.name,
                chunks,
                publication.metadata,
                metadata,
                visibility=publication.visibility,
                expected_sha256=publication.sha256,
                room=publishing.room,
            )
        return _published(published)

    async def publish_from_job(
        self, publishing: Publishing, publication: JobPublication, metadata: Metadata
    ) -> tuple[VersionView, bool]:
        """The version made of a file of `publication.from_job`'s results or checkpoints, and
        whether it is new."""
        with publishing.refusing():
            published = await self.models.publish_from_job(
                publishing.tenant,
                publishing.name,
                publication.from_job,
                publication.metadata,
                metadata,
                checkpoint_step=publication.checkpoint_step,
                results_file=publication.results_file or RESULTS_FILE,
                visibility=publication.visibility,
                room=publishing.room,
            )
        return _published(published)

    async def update(
        self,
        who: Principal,
        tenant: str,
        name: str,
        selector: str,
        update: MetadataUpdate,
        metadata: Metadata,
    ) -> VersionView:
        """The version after `update` (also when it changed nothing)."""
        model, version = await self._owned_version(who, tenant, name, selector)
        command = UpdateMetadata(version.number, update, self.models.clock.now())
        return await self._version_command(model, version, command, metadata)

    async def deprecate(
        self,
        who: Principal,
        tenant: str,
        name: str,
        selector: str,
        reason: str,
        metadata: Metadata,
    ) -> VersionView:
        model, version = await self._owned_version(who, tenant, name, selector)
        command = Deprecate(version.number, reason, self.models.clock.now())
        return await self._version_command(model, version, command, metadata)

    async def set_alias(
        self,
        who: Principal,
        tenant: str,
        name: str,
        alias: str,
        version: int,
        metadata: Metadata,
    ) -> AliasView:
        """The alias naming `version`: set, moved, or as it was (naming it already)."""
        model = await self._owned(who, tenant, name)
        command = SetAlias(alias, version, self.models.clock.now())
        _, events = await self._change(model, command, metadata)
        moved = [e for e in events if isinstance(e, ModelAliasSet)]
        # No event: it names that version already, as asked.
        previous = moved[0].previous if moved else version
        return AliasView(alias=alias, version=version, previous=previous)

    async def remove_alias(
        self, who: Principal, tenant: str, name: str, alias: str, metadata: Metadata
    ) -> None:
        model = await self._owned(who, tenant, name)
        await self._change(model, RemoveAlias(alias, self.models.clock.now()), metadata)

    async def set_webhook(
        self, who: Principal, tenant: str, name: str, url: str, metadata: Metadata
    ) -> WebhookView:
        """Notify the model's events to `url`, which must reach a public address."""
        model = await self._owned(who, tenant, name)
        await self._webhook_targets.admit(url, "url")
        await self._change(model, SetWebhook(url, self.models.clock.now()), metadata)
        return WebhookView(url=url)

    async def remove_webhook(
        self, who: Principal, tenant: str, name: str, metadata: Metadata
    ) -> None:
        model = await self._owned(who, tenant, name)
        await self._change(model, RemoveWebhook(self.models.clock.now()), metadata)

    async def _change(
        self, model: ModelState, command: ModelCommand, metadata: Metadata
    ) -> tuple[ModelState, list[ModelEvent]]:
        """Carry out `command` on the model: the model after it and the events it appended. A
        command that changes nothing answers the model as it is: it is as asked."""
        try:
            return await self.models.execute(model.tenant, model.name, command, metadata)
        except Unchanged:
            return model, []
        except ModelError as exc:
            raise refusal(exc) from None

    async def _version_command(
        self, model: ModelState, version: ModelVersion, command: ModelCommand, metadata: Metadata
    ) -> VersionView:
        """Carry out a command about `version`; the version as it is then."""
        model, _ = await self._change(model, command, metadata)
        changed = model.version(version.number)
        assert changed is not None  # versions are never removed
        return VersionView.of_state(model, changed)

    async def _acting(self, who: Principal, tenant: str) -> None:
        """The tenant an admin acts for must exist: a model of no tenant would be no one's."""
        if who.is_admin and (
            not TENANT_NAME.fullmatch(tenant) or await tenant_limits(self._pool, tenant) is None
        ):
            raise Refusal(Refused.INVALID, f"no tenant named {tenant[:100]!r}", field="tenant")

    async def _owned(self, who: Principal, tenant: str, name: str) -> ModelState:
        """The model a write is about: one of the tenant acted for."""
        await self._acting(who, tenant)
        _check_name(name)
        model = await self.models.load(tenant, name)
        if model is None:
            raise Refusal(Refused.NOT_FOUND, f"no model {tenant}/{name}")
        return model

    async def _owned_version(
        self, who: Principal, tenant: str, name: str, selector: str
    ) -> tuple[ModelState, ModelVersion]:
        """The owned model and the version `selector` names in it (read once, resolved here)."""
        model = await self._owned(who, tenant, name)
        try:
            reference = _reference(model.tenant, model.name, selector)
            return model, resolve(model, reference, model.tenant)
        except ModelError as exc:
            raise refusal(exc) from None

    async def _visible(
        self, who: Principal, owner: str | None, name: str
    ) -> tuple[ModelState, tuple[ModelVersion, ...]]:
        """The model and the versions `who` may see of it (not found when none)."""
        owner = _owner(who, owner)
        _check_name(name)
        model = await self.models.load(owner, name)
        versions = () if model is None else visible_versions(model, _viewer(who, owner))
        if model is None or not versions:
            raise Refusal(Refused.NOT_FOUND, f"no model {owner}/{name}")
        return model, versions

    async def _resolved(
        self, who: Principal, owner: str | None, name: str, selector: str
    ) -> tuple[ModelState, ModelVersion]:
        """The version `selector` names (number, alias or `latest`), as `who` may see it."""
        owner = _owner(who, owner)
        _check_name(name)
        try:
            reference = _reference(owner, name, selector)
            return await self.models.resolve(_viewer(who, owner), reference)
        except ModelError as exc:
            raise refusal(exc) from None


def _owner(who: Principal, named: str | None) -> str:
    """Whose model a read is about: the tenant named, else the caller's own."""
    if named:
        if not TENANT_NAME.fullmatch(named):
            raise Refusal(Refused.NOT_FOUND, f"no tenant named {named[:100]!r}", field="tenant")
        return named
    if who.tenant is None:
        raise Refusal(
            Refused.MALFORMED, "an admin names the model's tenant: add ?tenant=NAME", field="tenant"
        )
    return who.tenant


def _viewer(who: Principal, owner: str) -> str:
    """Who a read sees the model as: the admin sees every version, as its owner does."""
    return owner if who.is_admin or who.tenant is None else who.tenant


def _check_name(name: str) -> None:
    # A name no model can have: no such model (a read or a change; publishing says why).
    if not MODEL_NAME.fullmatch(name):
        raise Refusal(Refused.NOT_FOUND, f"no model named {name[:100]!r}")


def _reference(owner: str, name: str, selector: str) -> Reference:
    if selector == LATEST:
        return Reference(name=name, owner=owner)
    separator = ":" if selector.isdigit() else "@"
    try:
        return parse_reference(f"{owner}/{name}{separator}{selector}")
    except InvalidModel:
        raise UnknownVersion(f"{owner}/{name} has no version {selector[:100]!r}") from None
