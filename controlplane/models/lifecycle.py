"""A model's lifecycle as pure functions: `decide` turns a command and the model's state into
new events (or a refusal, raised), `evolve` folds events into the state; MODEL is the
aggregate for the command path (events/commands.py). No I/O here."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime

from controlplane.events.commands import Aggregate
from controlplane.invariants import InvariantBroken
from controlplane.models.errors import (
    DuplicatePublish,
    FieldError,
    ImmutableField,
    InvalidMetadata,
    InvalidModel,
    ModelBusy,
    ModelNotFound,
    TooManyAliases,
    Unchanged,
    UnknownAlias,
    UnknownVersion,
    VersionAliased,
    VersionDeprecated,
)
from controlplane.models.events import (
    ModelAliasRemoved,
    ModelAliasSet,
    ModelEvent,
    ModelMetadataUpdated,
    ModelVersionDeprecated,
    ModelVersionPublished,
    ModelWebhookRemoved,
    ModelWebhookSet,
    Visibility,
)
from controlplane.models.metadata import INT8_MAX, MAX_METRICS, SCHEMA_VERSION, ModelMetadata
from controlplane.models.names import check_alias, check_model_name
from controlplane.models.state import ModelState, ModelVersion
from controlplane.models.streams import model_of
from controlplane.models.updates import MetadataUpdate
from controlplane.tenants.validation import check_name

MAX_ALIASES = 64
"""Aliases a model may have: each is read with the model, on every resolve."""
MAX_REASON_CHARS = 500
_SHA256 = re.compile(r"[0-9a-f]{64}")


# Commands: what callers ask for. Each carries the instant it is decided at.


@dataclass(frozen=True, slots=True)
class Publish:
    """A new version of the model (its first creates the model), numbered next."""

    tenant: str
    name: str
    artifact_sha256: str
    size_bytes: int
    metadata: ModelMetadata
    actor: str
    at: datetime
    visibility: Visibility = Visibility.PRIVATE


@dataclass(frozen=True, slots=True)
class UpdateMetadata:
    """Change the mutable parts of a version's metadata (updates.py says which, and why)."""

    version: int
    update: MetadataUpdate
    at: datetime


@dataclass(frozen=True, slots=True)
class SetAlias:
    """Name `version` by `alias`: a new alias, or one moved from the version it named."""

    alias: str
    version: int
    at: datetime


@dataclass(frozen=True, slots=True)
class RemoveAlias:
    alias: str
    at: datetime


@dataclass(frozen=True, slots=True)
class Deprecate:
    version: int
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class SetWebhook:
    """Notify the model's events to `url` (checked by the caller: an http(s) URL whose host
    the relay may reach)."""

    url: str
    at: datetime


@dataclass(frozen=True, slots=True)
class RemoveWebhook:
    at: datetime


ModelCommand = (
    Publish | UpdateMetadata | SetAlias | RemoveAlias | Deprecate | SetWebhook | RemoveWebhook
)


def decide(command: ModelCommand, model: ModelState | None) -> list[ModelEvent]:
    """The events that carry out `command` on `model` (None: nothing published yet), or the
    refusal (a ModelError) raised."""
    if isinstance(command, Publish):
        return [_publish(command, model)]
    if model is None:
        raise ModelNotFound("no such model; publish a version first")
    match command:
        case UpdateMetadata():
            return [_update(command, model)]
        case SetAlias(alias, number, at):
            check_alias(alias)
            version = _version(model, number)
            if version.deprecated is not None:
                raise VersionDeprecated(
                    f"{_ref(model)}:{number} is deprecated ({version.deprecated}); an alias "
                    "names a version in use"
                )
            previous = model.aliases.get(alias)
            if previous == number:
                raise Unchanged(f"{_ref(model)}@{alias} names version {number} already")
            if previous is None and len(model.aliases) >= MAX_ALIASES:
                raise TooManyAliases(
                    f"{_ref(model)} has {MAX_ALIASES} aliases, as many as a model may have; "
                    "remove one first"
                )
            return [ModelAliasSet(alias=alias, version=number, previous=previous, at=at)]
        case RemoveAlias(alias, at):
            check_alias(alias)
            if alias not in model.aliases:
                raise UnknownAlias(f"{_ref(model)} has no alias {alias!r}")
            return [ModelAliasRemoved(alias=alias, version=model.aliases[alias], at=at)]
        case Deprecate(number, reason, at):
            version = _version(model, number)
            _check_reason(reason)
            if version.deprecated is not None:
                raise Unchanged(f"{_ref(model)}:{number} is deprecated already")
            naming = sorted(a for a, n in model.aliases.items() if n == number)
            if naming:
                raise VersionAliased(
                    f"{_ref(model)}:{number} is named by alias(es) {', '.join(naming)}; move or "
                    "remove them first, so that none names a deprecated version"
                )
            return [ModelVersionDeprecated(version=number, reason=reason, at=at)]
        case SetWebhook(url, at):
            if model.webhook_url == url:
                raise Unchanged(f"{_ref(model)} notifies {url} already")
            return [ModelWebhookSet(url=url, at=at)]
        case RemoveWebhook(at):
            if model.webhook_url is None:
                raise Unchanged(f"{_ref(model)} has no webhook")
            return [ModelWebhookRemoved(at=at)]
    raise InvariantBroken(f"unknown model command {type(command).__name__}")


def _publish(command: Publish, model: ModelState | None) -> ModelVersionPublished:
    check_name(command.tenant)
    check_model_name(command.name)
    if not _SHA256.fullmatch(command.artifact_sha256):
        raise InvalidModel(
            f"invalid artifact digest {command.artifact_sha256[:80]!r}: a lowercase hex sha256"
        )
    if not 0 <= command.size_bytes <= INT8_MAX:
        raise InvalidModel(f"invalid artifact size {command.size_bytes}")
    metadata = command.metadata.model_dump(mode="json")
    if model is not None:
        if (model.tenant, model.name) != (command.tenant, command.name):
            raise InvariantBroken(
                f"publishing {command.tenant}/{command.name} on the stream of {_ref(model)}"
            )
        for version in model.versions:
            # A publish retried after its answer was lost finds the version it made.
            if (version.artifact_sha256, version.metadata) == (command.artifact_sha256, metadata):
                raise DuplicatePublish(
                    f"{_ref(model)}:{version.number} has this artifact and metadata already"
                )
    return ModelVersionPublished(
        tenant=command.tenant,
        name=command.name,
        version=1 if model is None else model.next_number,
        artifact_sha256=command.artifact_sha256,
        size_bytes=command.size_bytes,
        metadata=metadata,
        metadata_schema=SCHEMA_VERSION,
        visibility=command.visibility,
        actor=command.actor,
        at=command.at,
    )


def _update(command: UpdateMetadata, model: ModelState) -> ModelMetadataUpdated:
    version = _version(model, command.version)
    given = command.update.model_dump(mode="json", exclude={"metrics"})
    changes = {
        part: value
        for part, value in given.items()
        if value is not None and value != version.metadata.get(part)
    }
    metrics = command.update.metrics
    for name, value in metrics.items():
        recorded = version.metrics.get(name)
        if recorded is not None and recorded != value:
            raise ImmutableField(
                f"{_ref(model)}:{version.number} recorded {name} = {recorded} already; a "
                "recorded metric never changes (publish a new version)"
            )
    added = {n: v for n, v in metrics.items() if n not in version.metrics}
    if len(version.metrics) + len(added) > MAX_METRICS:
        raise InvalidMetadata(
            (FieldError("metrics", f"at most {MAX_METRICS} metrics in all per version"),)
        )
    if not changes and not added:
        raise Unchanged(f"{_ref(model)}:{version.number} has this metadata already")
    return ModelMetadataUpdated(version=version.number, metrics=added, at=command.at, **changes)


def _version(model: ModelState, number: int) -> ModelVersion:
    version = model.version(number)
    if version is None:
        raise UnknownVersion(
            f"{_ref(model)} has no version {number} (it has 1 to {len(model.versions)})"
        )
    return version


def _check_reason(reason: str) -> None:
    if not reason.strip() or len(reason) > MAX_REASON_CHARS or not reason.isprintable():
        raise InvalidModel(
            f"a deprecation gives a reason: 1 to {MAX_REASON_CHARS} printable characters"
        )


def _ref(model: ModelState) -> str:
    return f"{model.tenant}/{model.name}"


def evolve(model: ModelState | None, event: ModelEvent) -> ModelState:
    """The model after `event`; events come from the store, so they are trusted to be legal,
    but a version out of sequence is never folded (numbers have no gaps)."""
    if isinstance(event, ModelVersionPublished):
        expected = 1 if model is None else model.next_number
        if event.version != expected:
            raise InvariantBroken(f"version {event.version} published where {expected} is next")
        version = ModelVersion(
            number=event.version,
            artifact_sha256=event.artifact_sha256,
            size_bytes=event.size_bytes,
            metadata=event.metadata,
            metadata_schema=event.metadata_schema,
            visibility=event.visibility,
            published_at=event.at,
            published_by=event.actor,
            updated_at=event.at,
        )
        if model is None:
            return ModelState(event.tenant, event.name, (version,), {})
        return replace(model, versions=(*model.versions, version))
    if model is None:
        raise InvariantBroken(f"{event.type_name} before ModelVersionPublished")
    match event:
        case ModelMetadataUpdated():
            version = _version(model, event.version)
            changed = event.model_dump(
                mode="json", include={"description", "domains", "tags", "citation"}
            )
            metadata = {
                **version.metadata,
                **{part: value for part, value in changed.items() if value is not None},
                "metrics": {**version.metrics, **event.metrics},
            }
            return _with(model, replace(version, metadata=metadata, updated_at=event.at))
        case ModelAliasSet(alias=alias, version=number):
            return replace(model, aliases={**model.aliases, alias: number})
        case ModelAliasRemoved(alias=alias):
            return replace(model, aliases={a: n for a, n in model.aliases.items() if a != alias})
        case ModelVersionDeprecated(version=number, reason=reason):
            version = _version(model, number)
            return _with(model, replace(version, deprecated=reason, updated_at=event.at))
        case ModelWebhookSet(url=url):
            return replace(model, webhook_url=url)
        case ModelWebhookRemoved():
            return replace(model, webhook_url=None)
    raise InvariantBroken(f"unknown model event {event.type_name}")


def _with(model: ModelState, version: ModelVersion) -> ModelState:
    versions = list(model.versions)
    versions[version.number - 1] = version
    return replace(model, versions=tuple(versions))


def _busy(stream_id: str, tries: int) -> ModelBusy:
    tenant, name = model_of(stream_id)
    return ModelBusy(
        f"model {tenant}/{name} kept changing; gave up after {tries} tries; nothing was written"
    )


MODEL: Aggregate[ModelCommand, ModelState | None, ModelEvent] = Aggregate(
    event_type=ModelEvent, initial=None, decide=decide, evolve=evolve, busy=_busy
)
"""A model's stream, for the command path."""
