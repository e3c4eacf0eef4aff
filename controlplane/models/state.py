"""A model as its stream has it: its versions (numbered 1, 2, ... without gaps) and aliases,
and `latest`, derived. No I/O here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controlplane.models.events import Visibility


@dataclass(frozen=True, slots=True)
class ModelVersion:
    number: int
    artifact_sha256: str
    size_bytes: int
    metadata: Mapping[str, Any]
    """The metadata document with its updates applied (JSON, as recorded)."""
    metadata_schema: int
    visibility: Visibility
    published_at: datetime
    published_by: str
    updated_at: datetime
    deprecated: str | None = None
    """Why it was deprecated; None while it is not."""

    @property
    def metrics(self) -> Mapping[str, float]:
        metrics: Mapping[str, float] = self.metadata.get("metrics", {})
        return metrics


@dataclass(frozen=True, slots=True)
class ModelState:
    tenant: str
    name: str
    versions: tuple[ModelVersion, ...]
    """By number: version n is `versions[n - 1]`."""
    aliases: Mapping[str, int]
    """Alias → the version it names (never a deprecated one)."""
    webhook_url: str | None = None
    """Where the model's events are notified; None: nowhere."""

    def version(self, number: int) -> ModelVersion | None:
        return self.versions[number - 1] if 1 <= number <= len(self.versions) else None

    @property
    def latest(self) -> ModelVersion | None:
        return latest(self.versions)

    @property
    def next_number(self) -> int:
        return len(self.versions) + 1


def latest(versions: Iterable[ModelVersion]) -> ModelVersion | None:
    """The highest of `versions` not deprecated; None if every one is."""
    live = [v for v in versions if v.deprecated is None]
    return max(live, key=lambda v: v.number, default=None)
