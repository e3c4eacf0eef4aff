"""The views of learners' log lines their readers get: a job's line as followed, a line found by
a search, and a page of those."""

from __future__ import annotations

from uuid import UUID

from pydantic import BaseModel, Field

from controlplane.instants import Instant
from controlplane.logs.lines import StoredLine, Stream


class LineView(BaseModel):
    """A line of a followed job's log (the job is the one followed)."""

    attempt: int = Field(ge=1)
    learner: int = Field(ge=0)
    stream: Stream
    seq: int = Field(ge=1)
    at: Instant
    line: str

    @classmethod
    def of(cls, stored: StoredLine) -> LineView:
        line = stored.line
        return cls(
            attempt=line.attempt,
            learner=line.learner,
            stream=line.stream,
            seq=line.seq,
            at=line.at,
            line=line.text,
        )


class FoundLine(BaseModel):
    """A line a search found, with its job and its place in its job's log."""

    job_id: UUID
    attempt: int = Field(ge=1)
    learner: int = Field(ge=0)
    stream: Stream
    seq: int = Field(ge=1)
    id: int = Field(ge=1, description="its place in its job's log")
    at: Instant
    line: str

    @classmethod
    def of(cls, stored: StoredLine) -> FoundLine:
        line = stored.line
        return cls(
            job_id=line.job_id,
            attempt=line.attempt,
            learner=line.learner,
            stream=line.stream,
            seq=line.seq,
            id=stored.id,
            at=line.at,
            line=line.text,
        )


class FoundPage(BaseModel):
    """A page of a search's lines, newest first."""

    lines: list[FoundLine]
    next_cursor: str | None = Field(description="fetches the next (older) page; null: none")
