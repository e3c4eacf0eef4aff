"""A learner's log line as stored, and the pure rules that make any output storable."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

MAX_LINE = 16384
"""The longest line stored, in characters; longer output is split into several lines."""

CONTINUES = " \u2026(continues)"
"""Ends every piece of a split line but the last, so that a reader sees the line goes on."""

REPLACEMENT = "\ufffd"


class Stream(StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"
    SYSTEM = "system"
    """What the agent itself says about a learner (it failed to start, say, or how it ended)."""


Series = tuple[UUID, int, int, Stream]
"""(job, attempt, learner, stream): the lines one writer numbers with `seq`."""


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of one stream of one learner; `seq` numbers a series' lines from 1."""

    job_id: UUID
    attempt: int
    learner: int
    stream: Stream
    seq: int
    at: datetime
    text: str

    def __post_init__(self) -> None:
        # Checked here, where the line is made, rather than by the database: one bad line
        # refused by COPY would fail its whole batch, again on every retry.
        if self.attempt < 1 or self.learner < 0 or self.seq < 1:
            raise ValueError(
                f"attempt and seq start at 1, learner at 0: got attempt {self.attempt}, "
                f"learner {self.learner}, seq {self.seq}"
            )
        if not isinstance(self.stream, Stream):
            raise ValueError(f"stream must be a Stream, not {self.stream!r}")
        if self.at.tzinfo is None:
            raise ValueError("at must carry a time zone")
        if len(self.text) > MAX_LINE:
            raise ValueError(
                f"a line holds at most {MAX_LINE} characters, not {len(self.text)}: "
                "split it with split_long_line"
            )
        if not is_storable(self.text):
            raise ValueError("a line must not hold NUL or lone surrogates: clean it with storable")

    @property
    def series(self) -> Series:
        return (self.job_id, self.attempt, self.learner, self.stream)


@dataclass(frozen=True, slots=True)
class StoredLine:
    """A line as read back, with its place in the job's log (the SSE id; resume after it)."""

    id: int
    line: LogLine


def is_storable(text: str) -> bool:
    """Whether Postgres text can hold `text`: no NUL, and valid UTF-8 (no lone surrogates)."""
    if "\0" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable(text: str) -> str:
    """`text` with NUL and lone surrogates replaced by U+FFFD, so that it can be stored."""
    if is_storable(text):
        return text
    return "".join(REPLACEMENT if c == "\0" or "\ud800" <= c <= "\udfff" else c for c in text)


def split_long_line(text: str, limit: int = MAX_LINE) -> list[str]:
    """`text` in pieces of at most `limit` characters, every piece but the last ending with
    CONTINUES; nothing is dropped: the pieces without their markers join to `text`."""
    if limit <= len(CONTINUES):
        raise ValueError(f"limit must exceed the marker's {len(CONTINUES)} characters")
    step = limit - len(CONTINUES)
    pieces = []
    start = 0
    while len(text) - start > limit:
        pieces.append(text[start : start + step] + CONTINUES)
        start += step
    pieces.append(text[start:])
    return pieces
