"""References to a model version, as users write them: `name:3` (a version), `name@production`
(an alias), `name` alone (latest), each optionally `tenant/`-prefixed for another tenant's
public model; and how one resolves, as seen by the tenant asking. No I/O here."""

from __future__ import annotations

import re
from dataclasses import dataclass

from controlplane.models.errors import InvalidModel, ModelNotFound, UnknownAlias, UnknownVersion
from controlplane.models.names import ALIAS, LATEST, MODEL_NAME
from controlplane.models.state import ModelState, ModelVersion, latest
from controlplane.models.visibility import visible_versions
from controlplane.tenants.validation import NAME as TENANT_NAME

MAX_REFERENCE_CHARS = 200
_REFERENCE = re.compile(r"(?:([^/:@]*)/)?([^/:@]*)(?::([^/:@]*)|@([^/:@]*))?")
_VERSION = re.compile(r"[1-9][0-9]{0,9}")
REFERENCE_PATTERN = (
    f"^(?:{TENANT_NAME.pattern}/)?{MODEL_NAME.pattern}(?::{_VERSION.pattern}|@{ALIAS.pattern})?$"
)
"""What `parse_reference` takes, for JSON Schema (`latest` is one of the aliases it admits)."""


@dataclass(frozen=True, slots=True)
class Reference:
    name: str
    owner: str | None = None
    """The tenant whose model it is; None: the asking tenant's own."""
    version: int | None = None
    alias: str | None = None
    """With `version`, None: the model's latest version."""


def parse_reference(text: str) -> Reference:
    """`[tenant/]name[:version|@alias]` as a Reference; InvalidModel saying what is wrong."""
    match = _REFERENCE.fullmatch(text) if len(text) <= MAX_REFERENCE_CHARS else None
    if match is None:
        raise InvalidModel(
            f"invalid model reference {text[:MAX_REFERENCE_CHARS]!r}: write name, name:3, "
            "name@alias, or tenant/name... for another tenant's public model"
        )
    owner, name, version, alias = match.groups()
    if owner is not None and not TENANT_NAME.fullmatch(owner):
        raise InvalidModel(f"invalid model reference {text!r}: {owner!r} is not a tenant name")
    if not MODEL_NAME.fullmatch(name):
        raise InvalidModel(f"invalid model reference {text!r}: {name!r} is not a model name")
    if version is not None and not _VERSION.fullmatch(version):
        raise InvalidModel(
            f"invalid model reference {text!r}: a version is a number from 1, e.g. {name}:3"
        )
    if alias is not None and alias != LATEST and not ALIAS.fullmatch(alias):
        raise InvalidModel(f"invalid model reference {text!r}: {alias!r} is not an alias")
    return Reference(
        name=name,
        owner=owner,
        version=None if version is None else int(version),
        alias=None if alias == LATEST else alias,
    )


def resolve(model: ModelState | None, reference: Reference, viewer: str) -> ModelVersion:
    """The version `reference` names in `model` (None: no such model), as the tenant `viewer`
    sees it: versions it may not see are answered as if they did not exist."""
    shown = f"{reference.owner or viewer}/{reference.name}"
    versions = () if model is None else visible_versions(model, viewer)
    if model is None or not versions:
        raise ModelNotFound(f"no model {shown}")
    by_number = {v.number: v for v in versions}
    if reference.alias is not None:
        version = by_number.get(model.aliases.get(reference.alias, 0))
        if version is None:
            raise UnknownAlias(f"{shown} has no alias {reference.alias!r}")
        return version
    if reference.version is not None:
        version = by_number.get(reference.version)
        if version is None:
            raise UnknownVersion(f"{shown} has no version {reference.version}")
        return version
    newest = latest(versions)
    if newest is None:
        raise UnknownVersion(
            f"every version of {shown} is deprecated; name one, e.g. {shown}:{versions[-1].number}"
        )
    return newest
