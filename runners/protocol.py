"""The learner's line protocol: what a learner reports, and how one report is one line.

A learner reports on its standard output, interleaved with the user's own output. A report is a
line that starts with `PREFIX` followed by one compact JSON object; every other line is ordinary
output. This works identically for a child process (its stdout pipe) and a Docker container (its
logs), so the node agent needs one parser for both.

This module is imported by the node agent, so it depends on pydantic (for `parse` only) and the
standard library, and it performs no I/O: `encode` and `parse` are pure.
"""

from __future__ import annotations

import json
import math
import operator
import re
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, Literal

if TYPE_CHECKING:
    from pydantic import TypeAdapter

# The version is part of the prefix: an agent that does not know a future version sees its lines
# as ordinary output (still shipped as logs) instead of misreading them.
PREFIX = "@@trainyard/1 "

Phase = Literal["DOWNLOADING", "PROCESSING", "STORING"]
PHASES: tuple[Phase, ...] = ("DOWNLOADING", "PROCESSING", "STORING")

# "interrupted": the phase stopped because the learner was asked to stop (SIGTERM or SIGINT),
# as opposed to "failed" on its own.
Outcome = Literal["succeeded", "failed", "interrupted"]

_SHA256 = re.compile(r"[0-9a-f]{64}")

# Messages are plain dataclasses, checked in __post_init__, and encoded with the standard
# library: a learner (and the launcher) report without importing pydantic, whose import is most
# of their start-up; the agent's `parse` validates with pydantic, built on first use.


@dataclass(frozen=True, slots=True, kw_only=True)
class _Message:
    # Reports carry the time they happened, not the time the agent read them: an agent that
    # restarts re-reads a running learner's backlog of lines, long after they were written.
    at: datetime

    def __post_init__(self) -> None:
        if self.at.tzinfo is None or self.at.utcoffset() is None:
            raise ValueError("at: a report's time carries its offset")


OUTCOMES: tuple[Outcome, ...] = ("succeeded", "failed", "interrupted")


def _count(message: object, *names: str) -> None:
    """Each field a whole number at least 0, as an int: a step may come as a numpy or torch
    integer (anything with __index__), and the line must still be JSON."""
    for name in names:
        value = operator.index(getattr(message, name))
        if value < 0:
            raise ValueError(f"{name} must be at least 0, not {value}")
        object.__setattr__(message, name, value)


def _seconds(message: object, name: str) -> None:
    value = float(getattr(message, name))
    if not value >= 0:
        raise ValueError(f"{name} must be at least 0, not {value}")
    object.__setattr__(message, name, value)


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseStarted(_Message):
    kind: Literal["phase_started"] = "phase_started"
    phase: Phase

    def __post_init__(self) -> None:
        _Message.__post_init__(self)
        _one_of("phase", self.phase, PHASES)


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseEnded(_Message):
    kind: Literal["phase_ended"] = "phase_ended"
    phase: Phase
    outcome: Outcome
    error: str | None = None
    duration_s: float
    # Set for PROCESSING only: the command's exit code when it exited, or the name of the signal
    # that killed it (e.g. "SIGKILL"); exactly one of the two.
    exit_code: int | None = None
    signal: str | None = None

    def __post_init__(self) -> None:
        _Message.__post_init__(self)
        _one_of("phase", self.phase, PHASES)
        _one_of("outcome", self.outcome, OUTCOMES)
        _seconds(self, "duration_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSaved(_Message):
    kind: Literal["checkpoint_saved"] = "checkpoint_saved"
    step: int
    path: str
    size_bytes: int
    sha256: str
    duration_s: float

    def __post_init__(self) -> None:
        _Message.__post_init__(self)
        _count(self, "step", "size_bytes")
        _seconds(self, "duration_s")
        if not _SHA256.fullmatch(self.sha256):
            raise ValueError("sha256: 64 lowercase hexadecimal digits")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRestored(_Message):
    kind: Literal["checkpoint_restored"] = "checkpoint_restored"
    step: int
    path: str

    def __post_init__(self) -> None:
        _Message.__post_init__(self)
        _count(self, "step")


@dataclass(frozen=True, slots=True, kw_only=True)
class Metric(_Message):
    kind: Literal["metric"] = "metric"
    step: int
    values: dict[str, float]

    def __post_init__(self) -> None:
        _Message.__post_init__(self)
        _count(self, "step")
        if not self.values:
            raise ValueError("values: at least one")
        # A 0-dimensional tensor or a numpy scalar, as the training loop had it.
        values = {str(name): float(value) for name, value in self.values.items()}
        object.__setattr__(self, "values", values)


if TYPE_CHECKING:
    from pydantic import Field

    Message = Annotated[
        PhaseStarted | PhaseEnded | CheckpointSaved | CheckpointRestored | Metric,
        Field(discriminator="kind"),
    ]
else:
    Message = PhaseStarted | PhaseEnded | CheckpointSaved | CheckpointRestored | Metric


def _json(value: Any) -> Any:
    # NaN and infinities are legitimate metric values (a diverging loss): as strings, the line
    # stays standard JSON.
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, datetime):
        # In UTC: every offset is one then (an offset in seconds would not parse back).
        return value.astimezone(UTC).isoformat().removesuffix("+00:00") + "Z"
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


def encode(message: Message) -> str:
    """The protocol line for `message`, without a line terminator.

    JSON escapes control characters, so the result never contains a newline, whatever the
    message's strings hold.
    """
    document = {f.name: _json(getattr(message, f.name)) for f in fields(message)}
    return PREFIX + json.dumps(document, separators=(",", ":"), allow_nan=False)


@cache
def _validator() -> TypeAdapter[Message]:
    from pydantic import ConfigDict, Field, TypeAdapter

    union = Annotated[
        PhaseStarted | PhaseEnded | CheckpointSaved | CheckpointRestored | Metric,
        Field(discriminator="kind"),
    ]
    # Strict about what a field is, lax about how JSON spells it (a time as text).
    return TypeAdapter(union, config=ConfigDict(ser_json_inf_nan="strings"))


def parse(line: str) -> Message | None:
    """The message a line carries, or None when it is ordinary output.

    A line that starts with the prefix but does not hold a valid message (a newer kind, a user's
    look-alike, a line cut short) is also ordinary output: it is kept as a log line rather than
    failing the reader.
    """
    from pydantic import ValidationError

    line = line.rstrip("\r\n")
    if not line.startswith(PREFIX):
        return None
    try:
        return _validator().validate_json(line[len(PREFIX) :])
    except (ValidationError, ValueError):
        return None
