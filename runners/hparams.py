"""A search trial's configuration, as its learner is given it: the hyperparameters (the trial's
point, a JSON object), the budget to train to, what the budget counts, and the trial's number.

The node agent sets TRAINYARD_HPARAMS, TRAINYARD_BUDGET, TRAINYARD_BUDGET_UNIT and
TRAINYARD_TRIAL; the launcher also writes the point to `hparams.json` and names it in
TRAINYARD_HPARAMS_FILE, which is read only when TRAINYARD_HPARAMS is unset. A job that is not a
trial has none of them: `load` returns None. Pure, like `runners.config`: it takes the
environment as a mapping.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from runners.config import BUDGET, BUDGET_UNIT, HPARAMS, HPARAMS_FILE, TRIAL, ConfigError

Unit = Literal["steps", "epochs"]
UNITS: tuple[Unit, ...] = ("steps", "epochs")

_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class TrialConfig:
    hparams: dict[str, Any]
    budget: int
    """Steps or epochs to have trained when the job ends, counted from the trial's start."""
    unit: Unit
    number: int | None
    """The trial's number within its search, when the agent gave it."""


def load(environ: Mapping[str, str] = os.environ) -> TrialConfig | None:
    """The trial's configuration, or None when the job is not a trial (no hyperparameters).

    Raises ConfigError, naming the variable, for hyperparameters that are not one JSON object
    and for a budget, unit or trial number that is missing or malformed.
    """
    text = _get(environ, HPARAMS)
    source = HPARAMS
    if text is None:
        path = _get(environ, HPARAMS_FILE)
        if path is None:
            return None
        source = f"{HPARAMS_FILE} ({path})"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"{source} cannot be read: {error}") from error
    return TrialConfig(
        hparams=parse_hparams(text, source),
        budget=_budget(environ),
        unit=_unit(environ),
        number=_number(environ),
    )


def parse_hparams(text: str, source: str = HPARAMS) -> dict[str, Any]:
    """The JSON object `text` holds; ConfigError naming `source` otherwise.

    Standard JSON only: NaN and Infinity are refused, so that `hparams.json` reads the same in
    any language."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as error:  # json.JSONDecodeError is a ValueError
        raise ConfigError(f"{source} must be a JSON object: {error}") from error
    if not isinstance(value, dict):
        raise ConfigError(f"{source} must be a JSON object, got {type(value).__name__}")
    return cast(dict[str, Any], value)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON")


def _budget(environ: Mapping[str, str]) -> int:
    value = _get(environ, BUDGET)
    if value is None:
        raise ConfigError(f"{BUDGET} must be set when {HPARAMS} is")
    if not _DIGITS.fullmatch(value) or int(value) < 1:
        raise ConfigError(f"{BUDGET} must be a whole number of at least 1, got {value!r}")
    return int(value)


def _unit(environ: Mapping[str, str]) -> Unit:
    value = _get(environ, BUDGET_UNIT)
    if value is None:
        raise ConfigError(f"{BUDGET_UNIT} must be set when {HPARAMS} is ({', '.join(UNITS)})")
    for unit in UNITS:
        if value == unit:
            return unit
    raise ConfigError(f"{BUDGET_UNIT} must be one of {', '.join(UNITS)}, got {value!r}")


def _number(environ: Mapping[str, str]) -> int | None:
    value = _get(environ, TRIAL)
    if value is None:
        return None
    if not _DIGITS.fullmatch(value):
        raise ConfigError(f"{TRIAL} must be a whole number, got {value!r}")
    return int(value)


def _get(environ: Mapping[str, str], name: str) -> str | None:
    # As runners.config reads every variable: an empty value counts as unset.
    value = environ.get(name, "").strip()
    return value or None
