"""The events of a model's stream (`model-<tenant>.<name>`, see streams.py). Each carries the
instant it happened (`at`).

They hold metadata as the JSON it was validated into, not as the schema's classes: the schema's
bounds may tighten in a later version, and an event recorded under older rules must stay
readable forever (the version it was validated against is recorded with it).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from controlplane.events.types import Event, event_type


class Visibility(StrEnum):
    PRIVATE = "private"
    """Only the owning tenant sees the version (the default)."""
    PUBLIC = "public"
    """Every tenant sees it (DLHub's publish and share)."""


class ModelEvent(Event):
    at: datetime


@event_type("ModelVersionPublished")
class ModelVersionPublished(ModelEvent):
    """A new version; its artifact, visibility and all but the mutable parts of its metadata
    (see updates.py) are fixed for good. `at` is its publication instant."""

    tenant: str
    name: str
    version: int = Field(description="1 for a model's first version, then one more each")
    artifact_sha256: str = Field(description="the artifact's content address (hex sha256)")
    size_bytes: int
    metadata: dict[str, Any] = Field(description="the metadata document, as validated")
    metadata_schema: int = Field(description="the metadata schema version it was validated by")
    visibility: Visibility
    actor: str = Field(description="who published it: 'user:alice'")


@event_type("ModelMetadataUpdated")
class ModelMetadataUpdated(ModelEvent):
    """A version's mutable metadata changed; a part that is null did not change."""

    version: int
    description: str | None = None
    domains: list[str] | None = None
    tags: list[str] | None = None
    citation: dict[str, Any] | None = None
    metrics: dict[str, float] = Field(
        default_factory=dict, description="metrics added (never ones recorded before)"
    )


@event_type("ModelAliasSet")
class ModelAliasSet(ModelEvent):
    """The alias names `version` from now on; moving an alias is this one event."""

    alias: str
    version: int
    previous: int | None = Field(description="the version it named before; null: a new alias")


@event_type("ModelAliasRemoved")
class ModelAliasRemoved(ModelEvent):
    alias: str
    version: int = Field(description="the version it named")


@event_type("ModelVersionDeprecated")
class ModelVersionDeprecated(ModelEvent):
    """The version is no longer `latest` and no alias may name it; it can still be named
    (`name:3`) and downloaded, for those who depend on it."""

    version: int
    reason: str


@event_type("ModelWebhookSet")
class ModelWebhookSet(ModelEvent):
    """From now on, the model's events are notified to `url` (signed with the tenant's webhook
    secret, as a job's are)."""

    url: str


@event_type("ModelWebhookRemoved")
class ModelWebhookRemoved(ModelEvent):
    """The model's events are no longer notified."""


NOTIFIED: tuple[type[ModelEvent], ...] = (
    ModelVersionPublished,
    ModelMetadataUpdated,
    ModelAliasSet,
    ModelAliasRemoved,
    ModelVersionDeprecated,
)
"""The events a model's webhook is told of: what changes its versions and aliases."""

EVENT_TYPES: tuple[type[Event], ...] = (
    ModelVersionPublished,
    ModelMetadataUpdated,
    ModelAliasSet,
    ModelAliasRemoved,
    ModelVersionDeprecated,
    ModelWebhookSet,
    ModelWebhookRemoved,
)
"""This feature's event types, for the registry (controlplane/event_registry.py)."""
