"""The rules for a model's name and its aliases, checked before anything is written.

The events carry no such constraints: they record what was decided, and rules that tighten
later must never make old events unreadable.
"""

from __future__ import annotations

import re

from controlplane.models.errors import InvalidModel, ReservedAlias

MODEL_NAME = re.compile(r"[a-z][a-z0-9._-]{0,63}")
"""Lowercase, as in stream ids and URLs; never ':', '@' or '/', which references use."""
ALIAS = re.compile(r"[a-z][a-z0-9_-]{0,31}")
"""Starting with a letter, so an alias never reads as a version number."""
LATEST = "latest"
"""The alias every model has, derived (its highest version not deprecated), never set."""


def check_model_name(name: str) -> str:
    if not MODEL_NAME.fullmatch(name):
        raise InvalidModel(
            f"invalid model name {name!r}: use 1 to 64 lowercase letters, digits, '.', '_' "
            "and '-', starting with a letter"
        )
    return name


def check_alias(alias: str) -> str:
    if alias == LATEST:
        raise ReservedAlias(
            f"alias {LATEST!r} is derived (the highest version not deprecated); it is never "
            "set or removed"
        )
    if not ALIAS.fullmatch(alias):
        raise InvalidModel(
            f"invalid alias {alias!r}: use 1 to 32 lowercase letters, digits, '_' and '-', "
            "starting with a letter"
        )
    return alias
