"""The MODEL aggregate on the one command path (events/commands.py) over the in-memory store
with a manual clock: publish, alias, update, deprecate, as loaded back; a publish racing
another gets the next number. No database."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from controlplane.clock import ManualClock
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.memory import InMemoryEventStore
from controlplane.events.metadata import Metadata
from controlplane.events.records import Appended, RecordedEvent
from controlplane.events.types import Event
from controlplane.models.errors import ModelNotFound, VersionAliased
from controlplane.models.events import (
    ModelAliasSet,
    ModelMetadataUpdated,
    ModelVersionDeprecated,
    ModelVersionPublished,
)
from controlplane.models.lifecycle import MODEL, Deprecate, Publish, SetAlias, UpdateMetadata
from controlplane.models.references import parse_reference, resolve
from controlplane.models.streams import model_stream
from controlplane.models.updates import validate_update
from tests.controlplane.models.samples import SHA_A, SHA_B, T0, metadata

META = Metadata(actor="user:alice", tenant="acme")
STREAM = model_stream("acme", "resnet")


def publish(clock: ManualClock, sha: str, title: str) -> Publish:
    return Publish("acme", "resnet", sha, 2048, metadata(title=title), "user:alice", clock.now())


async def test_a_model_is_published_aliased_updated_and_deprecated_through_the_store() -> None:
    clock = ManualClock(T0)
    store = InMemoryEventStore(EVENT_REGISTRY, clock)
    await MODEL.execute(store, STREAM, publish(clock, SHA_A, "first"), META)
    clock.advance(timedelta(hours=1))
    await MODEL.execute(store, STREAM, publish(clock, SHA_B, "second"), META)
    await MODEL.execute(store, STREAM, SetAlias("production", 1, clock.now()), META)
    update = validate_update({"citation": {"doi": "10.5555/model.2"}})
    await MODEL.execute(store, STREAM, UpdateMetadata(2, update, clock.now()), META)
    with pytest.raises(VersionAliased):
        await MODEL.execute(store, STREAM, Deprecate(1, "old", clock.now()), META)
    await MODEL.execute(store, STREAM, SetAlias("production", 2, clock.now()), META)
    executed = await MODEL.execute(store, STREAM, Deprecate(1, "old", clock.now()), META)

    loaded = await MODEL.load(store, STREAM)
    assert loaded.state == executed.state
    assert [type(e) for e in loaded.events] == [
        ModelVersionPublished,
        ModelVersionPublished,
        ModelAliasSet,
        ModelMetadataUpdated,
        ModelAliasSet,
        ModelVersionDeprecated,
    ]
    model = loaded.state
    assert model is not None
    assert model.aliases == {"production": 2}
    assert model.versions[0].published_at == T0  # the clock it was given
    assert model.versions[1].published_at == T0 + timedelta(hours=1)
    assert model.versions[1].metadata["citation"] == {"doi": "10.5555/model.2", "text": None}
    assert resolve(model, parse_reference("resnet@production"), "acme").artifact_sha256 == SHA_B
    assert resolve(model, parse_reference("resnet"), "acme").number == 2


async def test_commands_on_a_model_never_published_write_nothing() -> None:
    store = InMemoryEventStore(EVENT_REGISTRY)
    with pytest.raises(ModelNotFound):
        await MODEL.execute(store, STREAM, SetAlias("production", 1, T0), META)
    assert await store.version(STREAM) == 0


class RacingPublish:
    """The store, with another publish carried out between this command's read and append."""

    def __init__(self, store: InMemoryEventStore, other: Publish) -> None:
        self._store, self._other = store, other
        self._raced = False

    async def read_stream(self, stream_id: str) -> list[RecordedEvent]:
        return await self._store.read_stream(stream_id)

    async def append(
        self, stream_id: str, expected_version: int, events: Sequence[Event], metadata: Metadata
    ) -> Appended:
        if not self._raced:
            self._raced = True
            await MODEL.execute(self._store, stream_id, self._other, metadata)
        return await self._store.append(stream_id, expected_version, events, metadata)


async def test_a_publish_that_loses_a_race_is_decided_again_as_the_next_version() -> None:
    clock = ManualClock(T0)
    store = InMemoryEventStore(EVENT_REGISTRY, clock)
    racing = RacingPublish(store, publish(clock, SHA_A, "theirs"))
    executed = await MODEL.execute(racing, STREAM, publish(clock, SHA_B, "ours"), META)
    assert executed.state is not None
    assert [(v.number, v.metadata["title"]) for v in executed.state.versions] == [
        (1, "theirs"),
        (2, "ours"),
    ]
