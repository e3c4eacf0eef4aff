"""Turning learner output into numbered log lines for the shipper."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from controlplane.logs.lines import LogLine, Series, Stream, split_long_line, storable
from node_agent.runtime import LearnerSpec


class NumberedSink:
    """Numbers each series' lines from 1, cleans text Postgres cannot hold, and splits very
    long lines with a marker instead of dropping them."""

    def __init__(
        self, ship: Callable[[LogLine], None], store: Callable[[], Awaitable[None]]
    ) -> None:
        self._ship = ship
        self._store = store
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
        await self._store()

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
            self._ship(
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
