"""Turning learner output into numbered log lines for the shipper."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from uuid import UUID

from controlplane.agent_port.vocabulary import (
    JobLimits,
    LogLine,
    Series,
    Stream,
    split_long_line,
    storable,
)
from node_agent.log_shipper import LogShipper
from node_agent.runtime import LearnerSpec


class NumberedSink:
    """Numbers each series' lines from 1, cleans text Postgres cannot hold, and splits very
    long lines with a marker instead of dropping them."""

    def __init__(self, shipper: LogShipper) -> None:
        self._shipper = shipper
        self._seqs: defaultdict[Series, int] = defaultdict(int)
        self._stored: dict[Series, int] = {}

    def resume(self, spec: LearnerSpec, stream: str, stored_seq: int) -> None:
        """A re-adopted learner's output is read again from its first line: number it as
        before, but ship only what comes after the last line stored.

        Exact, with no gap and no duplicate, because the numbering is a function of the output
        alone; a line of several pieces stored in part ships only its missing pieces."""
        self._stored[(spec.job_id, spec.attempt, spec.learner, Stream(stream))] = stored_seq

    async def flush(self) -> None:
        """Store every line added so far (the database's error if it cannot)."""
        await self._shipper.flush()

    def hurry(self) -> None:
        """Store the lines added so far soon, without waiting for the next batch."""
        self._shipper.hurry()

    async def open(self, job_id: UUID, attempt: int, limits: JobLimits) -> None:
        """The job's `attempt` runs here: hold its lines to `limits` (see the shipper)."""
        await self._shipper.open(job_id, attempt, limits)

    async def seal(self, job_id: UUID) -> None:
        """The job's attempt has ended: store its lines, and say how many its limit dropped
        (the database's error if it cannot)."""
        await self._shipper.seal(job_id)

    def unstored(self, job_id: UUID) -> int:
        """The job's lines added and not yet stored."""
        return self._shipper.pending_of(job_id)

    def close(self, job_id: UUID, attempt: int) -> None:
        """The job's `attempt` here is over and its lines stored: forget the job once no other
        attempt of it runs here."""
        self._shipper.close(job_id, attempt)

    def add(self, spec: LearnerSpec, stream: str, text: str, at: datetime | None = None) -> None:
        """A line the learner wrote at `at` (the container engine's time, say), or now."""
        at = at or datetime.now(UTC)
        kind = Stream(stream)
        series: Series = (spec.job_id, spec.attempt, spec.learner, kind)
        stored = self._stored.get(series, 0)
        for piece in split_long_line(storable(text)):
            self._seqs[series] += 1
            if self._seqs[series] <= stored:
                continue
            self._shipper.add(
                LogLine(
                    job_id=spec.job_id,
                    attempt=spec.attempt,
                    learner=spec.learner,
                    stream=kind,
                    seq=self._seqs[series],
                    at=at,
                    text=piece,
                )
            )
