"""Where an inference job's queries have got it, as pure functions: which job commands move it
on. The lifecycle manager reads its progress each sweep and carries them out (service.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.jobs.lifecycle import Complete, Fail, JobStatus, StartQueries

Step = StartQueries | Complete | Fail
MAX_TRIES = 3
"""Claims of one query before it fails: its replicas kept dying or hanging on it."""


@dataclass(frozen=True, slots=True)
class Progress:
    """An inference job as its row and its queries have it."""

    state: JobStatus
    queries: int | None
    """How many it runs; None: until cancelled."""
    started: int
    unfinished: int
    """Queries started and not finished: running, or given back to run again."""
    load_error: str | None


def steps(progress: Progress, at: datetime) -> list[Step]:
    """The commands that bring the job where its queries are: FAILED when its model could not
    be loaded; PROCESSING from its first query on; COMPLETED once it has started all of them
    and none is left unfinished. None for a job that ended."""
    if progress.state.terminal:
        return []
    if progress.load_error is not None:
        return [Fail(f"its model could not be loaded: {progress.load_error}", at)]
    moves: list[Step] = []
    state = progress.state
    if state is JobStatus.QUEUED and progress.started > 0:
        moves.append(StartQueries(at))
        state = JobStatus.PROCESSING
    if (
        state is JobStatus.PROCESSING
        and progress.queries is not None
        and progress.started >= progress.queries
        and progress.unfinished == 0
    ):
        moves.append(Complete([0], at))
    return moves
