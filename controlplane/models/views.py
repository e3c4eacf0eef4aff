"""The model repository as its readers see it (the API, the dashboard, the CLI): a version, a
model with its versions and aliases, a page of search results, a model's history, an alias
set, a webhook, and an artifact to download."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, field_serializer

from controlplane.models.catalog import VersionRow
from controlplane.models.events import Visibility
from controlplane.models.query.nodes import FACETS
from controlplane.models.state import ModelState, ModelVersion
from controlplane.webhooks.deliveries import Delivery


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


class ModelView(BaseModel):
    """A model: the versions the reader may see, and the aliases naming them."""

    tenant: str
    name: str
    versions: list[VersionView] = Field(description="newest first")
    aliases: dict[str, int]
    latest: int | None = Field(description="the highest not deprecated")
    webhook_url: str | None = Field(
        description="where the model's events are notified (shown to its tenant only)"
    )


class VersionPage(BaseModel):
    """A page of a search's results, ranked."""

    versions: list[VersionView]
    total: int = Field(description="matching versions in all pages")
    facets: dict[str, dict[str, int]] = Field(
        description="per facet, how many matching versions have each value",
        json_schema_extra={
            "properties": {
                facet: {"type": "object", "additionalProperties": {"type": "integer"}}
                for facet in FACETS
            }
        },
    )
    next_cursor: str | None


class ModelHistoryEntry(BaseModel):
    """One event of a model."""

    version: int = Field(description="in the model's stream")
    position: int
    event: str
    at: datetime
    actor: str
    data: dict[str, Any]

    @field_serializer("at")
    def _isoformat(self, at: datetime) -> str:
        # As the history was always written: Python's form of the offset (+00:00, not Z).
        return at.isoformat()


class ModelHistory(BaseModel):
    tenant: str
    name: str
    history: list[ModelHistoryEntry]
    webhooks: list[Delivery] = Field(
        description="every attempt to deliver the model's notifications, in the order they "
        "ended (from the stream webhook-model-<tenant>.<name>), as a job's history shows its own"
    )


class AliasView(BaseModel):
    alias: str
    version: int
    previous: int | None = Field(description="null: a new alias")


class WebhookView(BaseModel):
    url: str


@dataclass(frozen=True, slots=True)
class Artifact:
    """A version's artifact, found in the store, about to be read."""

    model: ModelState
    version: ModelVersion
    size: int

    @property
    def filename(self) -> str:
        return f"{self.model.name}-v{self.version.number}"

    @property
    def sha256(self) -> str:
        return self.version.artifact_sha256

    @property
    def digest(self) -> str:
        """The sha256 as a Repr-Digest states it (RFC 9530: base64 of the bytes)."""
        return base64.b64encode(binascii.unhexlify(self.sha256)).decode()
