"""A model's lifecycle (`decide`, `evolve`): one example per rule a user meets, then random
command sequences that must keep the invariants (versions 1..n without gaps, aliases naming
live versions, `latest` derived, replay giving the same state)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.types import Event
from controlplane.models.errors import (
    DuplicatePublish,
    ImmutableField,
    InvalidMetadata,
    InvalidModel,
    ModelError,
    ModelNotFound,
    ReservedAlias,
    TooManyAliases,
    Unchanged,
    UnknownAlias,
    UnknownVersion,
    VersionAliased,
    VersionDeprecated,
)
from controlplane.models.events import (
    ModelAliasSet,
    ModelEvent,
    ModelMetadataUpdated,
    ModelVersionPublished,
    ModelWebhookRemoved,
    ModelWebhookSet,
    Visibility,
)
from controlplane.models.lifecycle import (
    MAX_ALIASES,
    MODEL,
    Deprecate,
    ModelCommand,
    Publish,
    RemoveAlias,
    RemoveWebhook,
    SetAlias,
    SetWebhook,
    UpdateMetadata,
    decide,
)
from controlplane.models.metadata import MAX_METRICS, SCHEMA_VERSION
from controlplane.models.state import ModelState
from controlplane.models.updates import validate_update
from tests.controlplane.models.samples import SHA_A, SHA_B, T0, metadata


def publish(sha: str = SHA_A, title: str = "v", name: str = "resnet") -> Publish:
    return Publish("acme", name, sha, 1024, metadata(title=title), "user:alice", T0)


def run(commands: Iterable[ModelCommand]) -> tuple[ModelState, list[ModelEvent]]:
    """The model after `commands`, each accepted, and the events they made."""
    model: ModelState | None = None
    events: list[ModelEvent] = []
    for command in commands:
        new = decide(command, model)
        model = MODEL.fold(model, new)
        events.extend(new)
    assert model is not None
    return model, events


def three_versions() -> ModelState:
    model, _ = run([publish(title="1"), publish(title="2"), publish(title="3")])
    return model


def update(version: int, **document: object) -> UpdateMetadata:
    return UpdateMetadata(version, validate_update(document), T0)


def test_a_publish_numbers_versions_from_one_and_records_the_metadata_as_json() -> None:
    model, events = run([publish(title="first"), publish(SHA_B, title="second")])
    assert [v.number for v in model.versions] == [1, 2]
    first = events[0]
    assert isinstance(first, ModelVersionPublished)
    assert (first.version, first.metadata_schema) == (1, SCHEMA_VERSION)
    assert first.metadata == metadata(title="first").model_dump(mode="json")
    assert first.visibility is Visibility.PRIVATE and first.actor == "user:alice"
    assert model.latest is not None and model.latest.number == 2


def test_the_same_bytes_may_be_published_again_with_other_metadata_but_not_twice_alike() -> None:
    model, _ = run([publish(title="a"), publish(title="b")])  # one blob, two versions
    with pytest.raises(DuplicatePublish, match="acme/resnet:1 has this artifact and metadata"):
        decide(publish(title="a"), model)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (publish(name="Res/Net"), "invalid model name"),
        (publish(sha="A" * 64), "invalid artifact digest"),
        (
            Publish("acme", "m", SHA_A, -1, metadata(), "user:alice", T0),
            "invalid artifact size",
        ),
    ],
)
def test_a_publish_with_a_bad_name_or_artifact_is_refused(command: Publish, message: str) -> None:
    with pytest.raises(InvalidModel, match=message):
        decide(command, None)


def test_commands_on_a_model_never_published_are_not_found() -> None:
    for command in (update(1, tags=["x"]), SetAlias("prod", 1, T0), RemoveAlias("prod", T0)):
        with pytest.raises(ModelNotFound):
            decide(command, None)


def test_an_unknown_version_is_refused_naming_the_versions_there_are() -> None:
    with pytest.raises(UnknownVersion, match=r"acme/resnet has no version 4 \(it has 1 to 3\)"):
        decide(SetAlias("prod", 4, T0), three_versions())


def test_moving_an_alias_is_one_event_recording_where_it_was() -> None:
    model, _ = run([publish(title="1"), publish(title="2"), SetAlias("production", 1, T0)])
    moved = decide(SetAlias("production", 2, T0), model)
    assert moved == [ModelAliasSet(alias="production", version=2, previous=1, at=T0)]
    assert MODEL.fold(model, moved).aliases == {"production": 2}
    with pytest.raises(Unchanged, match="names version 2 already"):
        decide(SetAlias("production", 2, T0), MODEL.fold(model, moved))


def test_latest_is_reserved_and_aliases_are_checked() -> None:
    model = three_versions()
    with pytest.raises(ReservedAlias, match="'latest' is derived"):
        decide(SetAlias("latest", 1, T0), model)
    with pytest.raises(ReservedAlias):
        decide(RemoveAlias("latest", T0), model)
    for bad in ("3", "Prod", "a" * 33, "a@b"):
        with pytest.raises(InvalidModel, match="invalid alias"):
            decide(SetAlias(bad, 1, T0), model)
    with pytest.raises(UnknownAlias, match="no alias 'staging'"):
        decide(RemoveAlias("staging", T0), model)


def test_a_model_has_at_most_so_many_aliases() -> None:
    aliases = [SetAlias(f"a{n}", 1, T0) for n in range(MAX_ALIASES)]
    model, _ = run([publish(title="1"), publish(title="2"), *aliases])
    with pytest.raises(TooManyAliases, match="remove one first"):
        decide(SetAlias("one-more", 1, T0), model)
    assert decide(SetAlias("a0", 2, T0), model)  # moving one still is


def test_latest_is_the_highest_version_not_deprecated() -> None:
    model, _ = run([*(publish(title=str(n)) for n in range(3)), Deprecate(3, "regressed", T0)])
    assert model.latest is not None and model.latest.number == 2
    everything_old = [Deprecate(n, "old", T0) for n in (1, 2, 3)]
    model, _ = run([*(publish(title=str(n)) for n in range(3)), *everything_old])
    assert model.latest is None


def test_a_deprecated_version_takes_no_alias_and_an_aliased_one_is_not_deprecated() -> None:
    model, _ = run([publish(title="1"), publish(title="2"), SetAlias("prod", 1, T0)])
    with pytest.raises(VersionAliased, match="named by alias\\(es\\) prod; move or remove"):
        decide(Deprecate(1, "old", T0), model)
    model = MODEL.fold(model, decide(Deprecate(2, "broken", T0), model))
    assert model.versions[1].deprecated == "broken"
    with pytest.raises(VersionDeprecated, match="acme/resnet:2 is deprecated \\(broken\\)"):
        decide(SetAlias("prod", 2, T0), model)
    with pytest.raises(Unchanged):
        decide(Deprecate(2, "again", T0), model)
    for reason in ("", "  ", "x" * 501, "line\nbreak"):
        with pytest.raises(InvalidModel, match="gives a reason"):
            decide(Deprecate(1, reason, T0), model)


def test_an_update_changes_only_the_mutable_parts_and_adds_metrics() -> None:
    model = three_versions()
    later = T0 + timedelta(days=1)
    command = UpdateMetadata(
        2,
        validate_update(
            {"description": "better words", "tags": ["vision"], "metrics": {"f1": 0.5}}
        ),
        later,
    )
    events = decide(command, model)
    # Tags were ["vision", "resnet"]: changed; description changed; f1 added.
    assert events == [
        ModelMetadataUpdated(
            version=2, description="better words", tags=["vision"], metrics={"f1": 0.5}, at=later
        )
    ]
    after = MODEL.fold(model, events)
    version = after.versions[1]
    assert version.metadata["description"] == "better words"
    assert version.metrics == {"accuracy": 0.93, "top_5": 0.99, "f1": 0.5}
    assert version.updated_at == later and version.published_at == T0
    # Everything else as published, and the other versions untouched.
    changed = ("description", "tags", "metrics")
    unchanged = {k: v for k, v in version.metadata.items() if k not in changed}
    assert unchanged == {k: v for k, v in model.versions[1].metadata.items() if k not in changed}
    assert after.versions[0] == model.versions[0]


def test_a_recorded_metric_never_changes_and_a_no_op_update_is_unchanged() -> None:
    model = three_versions()
    with pytest.raises(ImmutableField, match=r"recorded accuracy = 0\.93 already"):
        decide(update(1, metrics={"accuracy": 0.99}), model)
    with pytest.raises(Unchanged):
        decide(update(1, metrics={"accuracy": 0.93}, tags=["vision", "resnet"]), model)


def test_metrics_added_stay_bounded() -> None:
    model = three_versions()
    many = {f"m{n}": 1.0 for n in range(MAX_METRICS - 1)}
    with pytest.raises(InvalidMetadata, match=f"at most {MAX_METRICS} metrics"):
        decide(update(1, metrics=many), model)


def test_a_webhook_is_set_moved_and_removed_once_each() -> None:
    model = three_versions()
    assert model.webhook_url is None
    with pytest.raises(Unchanged, match="no webhook"):
        decide(RemoveWebhook(T0), model)
    model, events = run([publish(), SetWebhook("https://ci.example/hook", T0)])
    assert events[-1] == ModelWebhookSet(url="https://ci.example/hook", at=T0)
    assert model.webhook_url == "https://ci.example/hook"
    with pytest.raises(Unchanged, match=r"notifies \S+ already"):
        decide(SetWebhook("https://ci.example/hook", T0), model)
    removed = decide(RemoveWebhook(T0), model)
    assert removed == [ModelWebhookRemoved(at=T0)]
    assert MODEL.fold(model, removed).webhook_url is None


# Random command sequences. Small pools of names and numbers, so that commands hit existing
# versions and aliases as often as missing ones.
publishes = st.builds(
    Publish,
    tenant=st.just("acme"),
    name=st.just("m"),
    artifact_sha256=st.sampled_from([SHA_A, SHA_B]),
    size_bytes=st.just(10),
    metadata=st.sampled_from([metadata(title=t) for t in "abc"]),
    actor=st.just("user:alice"),
    at=st.just(T0),
    visibility=st.sampled_from(Visibility),
)
commands = st.one_of(
    publishes,
    st.builds(
        UpdateMetadata,
        version=st.integers(0, 5),
        update=st.sampled_from(
            [
                validate_update({"tags": ["x"]}),
                validate_update({"metrics": {"accuracy": 0.5}}),
                validate_update({"metrics": {"new": 1.0}, "description": "d"}),
            ]
        ),
        at=st.just(T0),
    ),
    st.builds(
        SetAlias,
        alias=st.sampled_from(["prod", "staging", "latest"]),
        version=st.integers(0, 5),
        at=st.just(T0),
    ),
    st.builds(RemoveAlias, alias=st.sampled_from(["prod", "staging"]), at=st.just(T0)),
    st.builds(Deprecate, version=st.integers(0, 5), reason=st.just("old"), at=st.just(T0)),
    st.builds(
        SetWebhook,
        url=st.sampled_from(["https://a.example/", "https://b.example/"]),
        at=st.just(T0),
    ),
    st.builds(RemoveWebhook, at=st.just(T0)),
)


def stored(events: Sequence[Event]) -> list[ModelEvent]:
    """`events` as the registry writes and reads them back."""
    read = [
        EVENT_REGISTRY.decode(e.type_name, e.schema_version, e.model_dump_json()) for e in events
    ]
    assert all(isinstance(e, ModelEvent) for e in read)
    return [e for e in read if isinstance(e, ModelEvent)]


@settings(max_examples=200, deadline=None)
@given(publishes, st.lists(commands, max_size=25))
def test_random_commands_keep_the_invariants(first: Publish, rest: list[ModelCommand]) -> None:
    model: ModelState | None = None
    log: list[ModelEvent] = []
    for command in [first, *rest]:
        try:
            new = decide(command, model)
        except ModelError:
            continue  # a refusal writes nothing; the state stays as it was
        assert new, "an accepted command always records what happened"
        model = MODEL.fold(model, new)
        log.extend(new)
        assert [v.number for v in model.versions] == list(range(1, len(model.versions) + 1))
        assert all(
            (v := model.version(n)) is not None and v.deprecated is None
            for n in model.aliases.values()
        ), "an alias names a version that exists and is not deprecated"
        live = [v.number for v in model.versions if v.deprecated is None]
        assert (model.latest.number if model.latest else None) == max(live, default=None)
        assert "latest" not in model.aliases
        if isinstance(command, UpdateMetadata):
            assert model.version(command.version) is not None
    assert MODEL.fold(None, log) == model
    assert MODEL.fold(None, stored(log)) == model
