"""References (`name:3`, `name@alias`, `name`, `tenant/name`) and how they resolve for the
owning tenant and for another one, who sees public versions only and a private model as none."""

from __future__ import annotations

import pytest

from controlplane.models.errors import InvalidModel, ModelNotFound, UnknownAlias, UnknownVersion
from controlplane.models.events import Visibility
from controlplane.models.lifecycle import MODEL, Deprecate, Publish, SetAlias, decide
from controlplane.models.references import Reference, parse_reference, resolve
from controlplane.models.state import ModelState
from controlplane.models.streams import model_of, model_stream
from controlplane.models.visibility import visible_versions
from tests.controlplane.models.samples import SHA_A, T0, metadata


@pytest.mark.parametrize(
    ("text", "reference"),
    [
        ("resnet", Reference("resnet")),
        ("resnet:3", Reference("resnet", version=3)),
        ("resnet@production", Reference("resnet", alias="production")),
        ("resnet@latest", Reference("resnet")),
        ("acme/resnet-50.v2:12", Reference("resnet-50.v2", owner="acme", version=12)),
        ("my-team/bert@staging", Reference("bert", owner="my-team", alias="staging")),
    ],
)
def test_references_parse(text: str, reference: Reference) -> None:
    assert parse_reference(text) == reference


@pytest.mark.parametrize(
    "text",
    [
        "",
        "resnet:",
        "resnet:0",
        "resnet:03",
        "resnet:-1",
        "resnet:99999999999",
        "resnet:three",
        "resnet@",
        "resnet@Prod",
        "resnet:3@prod",
        "a/b/c",
        "/resnet",
        "Acme/resnet",
        "ResNet",
        "res net",
        "resnet\n",
        "r" * 201,
    ],
)
def test_bad_references_are_refused(text: str) -> None:
    with pytest.raises(InvalidModel, match="invalid model reference"):
        parse_reference(text)


def test_a_models_stream_names_its_tenant_and_name() -> None:
    stream = model_stream("my-team", "resnet-50.v2")
    assert stream == "model-my-team.resnet-50.v2"
    assert model_of(stream) == ("my-team", "resnet-50.v2")
    with pytest.raises(InvalidModel):
        model_stream("acme", "a/b")


def model_of_acme() -> ModelState:
    """Versions 1 (public), 2 (private), 3 (public, deprecated); aliases to 1 and 2."""
    model: ModelState | None = None
    for command in (
        Publish("acme", "m", SHA_A, 1, metadata(title="1"), "u", T0, Visibility.PUBLIC),
        Publish("acme", "m", SHA_A, 1, metadata(title="2"), "u", T0),
        Publish("acme", "m", SHA_A, 1, metadata(title="3"), "u", T0, Visibility.PUBLIC),
        Deprecate(3, "worse", T0),
        SetAlias("prod", 1, T0),
        SetAlias("canary", 2, T0),
    ):
        model = MODEL.fold(model, decide(command, model))
    assert model is not None
    return model


def test_the_owner_resolves_every_version_and_alias() -> None:
    model = model_of_acme()
    assert resolve(model, parse_reference("m"), "acme").number == 2
    assert resolve(model, parse_reference("m:3"), "acme").number == 3  # deprecated, still named
    assert resolve(model, parse_reference("m@canary"), "acme").number == 2
    with pytest.raises(UnknownVersion, match="acme/m has no version 4"):
        resolve(model, parse_reference("m:4"), "acme")
    with pytest.raises(UnknownAlias, match="acme/m has no alias 'staging'"):
        resolve(model, parse_reference("m@staging"), "acme")


def test_another_tenant_sees_public_versions_only_as_if_the_rest_did_not_exist() -> None:
    model = model_of_acme()
    assert [v.number for v in visible_versions(model, "other")] == [1, 3]
    assert resolve(model, parse_reference("acme/m"), "other").number == 1  # 3 is deprecated
    assert resolve(model, parse_reference("acme/m@prod"), "other").number == 1
    with pytest.raises(UnknownVersion, match=r"acme/m has no version 2$"):
        resolve(model, parse_reference("acme/m:2"), "other")
    with pytest.raises(UnknownAlias, match="acme/m has no alias 'canary'"):
        resolve(model, parse_reference("acme/m@canary"), "other")


def test_a_private_model_is_not_found_for_another_tenant_as_one_that_does_not_exist() -> None:
    private = MODEL.fold(None, decide(Publish("acme", "p", SHA_A, 1, metadata(), "u", T0), None))
    assert private is not None
    with pytest.raises(ModelNotFound, match=r"^no model acme/p$"):
        resolve(private, parse_reference("acme/p:1"), "other")
    with pytest.raises(ModelNotFound, match=r"^no model acme/p$"):
        resolve(None, parse_reference("acme/p:1"), "other")


def test_a_model_whose_every_version_is_deprecated_has_no_latest() -> None:
    model = MODEL.fold(None, decide(Publish("acme", "d", SHA_A, 1, metadata(), "u", T0), None))
    model = MODEL.fold(model, decide(Deprecate(1, "old", T0), model))
    with pytest.raises(UnknownVersion, match=r"every version of acme/d is deprecated.*acme/d:1"):
        resolve(model, parse_reference("d"), "acme")
