"""The `models` projection: `model_versions` (one row per version, what the search runs over)
and `model_aliases`. The truth stays in the model streams; both tables are rebuilt from them."""

from __future__ import annotations

import json
from collections.abc import Sequence

from controlplane.database import Executor
from controlplane.events.records import RecordedEvent
from controlplane.models.events import (
    ModelAliasRemoved,
    ModelAliasSet,
    ModelMetadataUpdated,
    ModelVersionDeprecated,
    ModelVersionPublished,
)
from controlplane.models.streams import CATEGORY, model_of
from controlplane.queries import Q


class ModelsProjection:
    name = "models"
    tables: Sequence[str] = ("model_versions", "model_aliases")
    categories: frozenset[str] | None = frozenset({CATEGORY})

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        # Publications go in one statement a batch (a bulk publish makes many). The other
        # events can only follow their version's publication, so applying them after every
        # publication of the batch, in order, gives the same rows.
        published = [e.event for e in events if isinstance(e.event, ModelVersionPublished)]
        if published:
            await conn.execute(
                Q["insert_model_versions"],
                [p.tenant for p in published],
                [p.name for p in published],
                [p.version for p in published],
                [p.artifact_sha256 for p in published],
                [p.size_bytes for p in published],
                [json.dumps(p.metadata) for p in published],
                [p.metadata_schema for p in published],
                [p.visibility.value for p in published],
                [p.at for p in published],
                [p.actor for p in published],
            )
        for recorded in events:
            tenant, name = model_of(recorded.stream_id)
            match recorded.event:
                case ModelMetadataUpdated() as updated:
                    await conn.execute(
                        Q["update_model_metadata"],
                        tenant,
                        name,
                        updated.version,
                        updated.description,
                        updated.domains,
                        updated.tags,
                        None if updated.citation is None else json.dumps(updated.citation),
                        json.dumps(updated.metrics),
                        updated.at,
                    )
                case ModelVersionDeprecated() as deprecated:
                    await conn.execute(
                        Q["deprecate_model_version"],
                        tenant,
                        name,
                        deprecated.version,
                        deprecated.reason,
                        deprecated.at,
                    )
                case ModelAliasSet() as alias_set:
                    await conn.execute(
                        Q["set_model_alias"], tenant, name, alias_set.alias, alias_set.version
                    )
                case ModelAliasRemoved() as removed:
                    await conn.execute(Q["remove_model_alias"], tenant, name, removed.alias)
