"""The learner's line protocol: what a learner reports, and how one report is one line.

A learner reports on its standard output, interleaved with the user's own output. A report is a
line that starts with `PREFIX` followed by one compact JSON object; every other line is ordinary
output. This works identically for a child process (its stdout pipe) and a Docker container (its
logs), so the node agent needs one parser for both.

This module is imported by the node agent, so it depends on pydantic and the standard library
only, and it performs no I/O: `encode` and `parse` are pure.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    TypeAdapter,
    ValidationError,
)

# The version is part of the prefix: an agent that does not know a future version sees its lines
# as ordinary output (still shipped as logs) instead of misreading them.
PREFIX = "@@trainyard/1 "

Phase = Literal["DOWNLOADING", "PROCESSING", "STORING"]
PHASES: tuple[Phase, ...] = ("DOWNLOADING", "PROCESSING", "STORING")

# "interrupted": the phase stopped because the learner was asked to stop (SIGTERM or SIGINT),
# as opposed to "failed" on its own.
Outcome = Literal["succeeded", "failed", "interrupted"]


class _Message(BaseModel):
    # Reports carry the time they happened, not the time the agent read them: an agent that
    # restarts re-reads a running learner's backlog of lines, long after they were written.
    # NaN and infinities are legitimate metric values (a diverging loss); "strings" keeps them
    # representable while the line stays standard JSON.
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    at: AwareDatetime


class PhaseStarted(_Message):
    kind: Literal["phase_started"] = "phase_started"
    phase: Phase


class PhaseEnded(_Message):
    kind: Literal["phase_ended"] = "phase_ended"
    phase: Phase
    outcome: Outcome
    error: str | None = None
    duration_s: NonNegativeFloat
    # Set for PROCESSING only: the command's exit code when it exited, or the name of the signal
    # that killed it (e.g. "SIGKILL"); exactly one of the two.
    exit_code: int | None = None
    signal: str | None = None


class CheckpointSaved(_Message):
    kind: Literal["checkpoint_saved"] = "checkpoint_saved"
    step: NonNegativeInt
    path: str
    size_bytes: NonNegativeInt
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    duration_s: NonNegativeFloat


class CheckpointRestored(_Message):
    kind: Literal["checkpoint_restored"] = "checkpoint_restored"
    step: NonNegativeInt
    path: str


class Metric(_Message):
    kind: Literal["metric"] = "metric"
    step: NonNegativeInt
    values: Annotated[dict[str, float], Field(min_length=1)]


Message = Annotated[
    PhaseStarted | PhaseEnded | CheckpointSaved | CheckpointRestored | Metric,
    Field(discriminator="kind"),
]

_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)


def encode(message: Message) -> str:
    """The protocol line for `message`, without a line terminator.

    JSON escapes control characters, so the result never contains a newline, whatever the
    message's strings hold.
    """
    return PREFIX + message.model_dump_json()


def parse(line: str) -> Message | None:
    """The message a line carries, or None when it is ordinary output.

    A line that starts with the prefix but does not hold a valid message (a newer kind, a user's
    look-alike, a line cut short) is also ordinary output: it is kept as a log line rather than
    failing the reader.
    """
    line = line.rstrip("\r\n")
    if not line.startswith(PREFIX):
        return None
    try:
        return _MESSAGE.validate_json(line[len(PREFIX) :])
    except ValidationError:
        return None
