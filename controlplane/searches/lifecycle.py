"""A search's state, folded from its events (`evolve`), and what it does next (`advance`): pure,
like the job lifecycle. `advance` takes what became of the trials' jobs and returns the events
to record: each finished rung or failure, a new best, the searcher's decisions, the end.

A trial's jobs have ids derived from the search, the trial and the rung (`trial_job_id`): a
control plane killed between recording a decision and submitting its job submits the same job
again, which the job service takes as the retry it is, never as a second job."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal
from uuid import UUID

from controlplane.events.commands import Aggregate
from controlplane.searches.events import (
    BestUpdated,
    SearchEnded,
    SearchEvent,
    SearchSubmitted,
    TrialCreated,
    TrialFailed,
    TrialPromoted,
    TrialPruned,
    TrialRungFinished,
)
from controlplane.searches.spec import SearchSpec, searcher_for
from controlplane.searches.trials import Create, Promote, Prune, Trial, TrialState, best

State = Literal["running", "completed", "failed", "cancelled"]


@dataclass(frozen=True, slots=True)
class Search:
    search_id: UUID
    tenant: str
    spec: SearchSpec
    trials: tuple[Trial, ...] = ()
    jobs: tuple[UUID, ...] = ()
    """Each trial's current job (by trial number)."""
    state: State = "running"
    best: tuple[int, int, float] | None = None
    """(trial, rung, metric) as last recorded."""

    @property
    def failed(self) -> int:
        return sum(t.state is TrialState.FAILED for t in self.trials)

    @property
    def running(self) -> list[Trial]:
        return [t for t in self.trials if t.state is TrialState.RUNNING]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a running trial's current job ended: its metric at the end (None: it reported
    none), or why it failed."""

    number: int
    metric: float | None = None
    failure: str | None = None


def trial_job_id(search_id: UUID, number: int, rung: int) -> UUID:
    return uuid.uuid5(search_id, f"trial-{number}-rung-{rung}")


def evolve(search: Search | None, event: SearchEvent) -> Search:
    match event:
        case SearchSubmitted():
            return Search(event.search_id, event.tenant, event.spec)
    if search is None:
        raise ValueError(f"{type(event).__name__} before SearchSubmitted")
    match event:
        case TrialCreated():
            trial = Trial(
                event.number, event.point, 0, event.budget, TrialState.RUNNING, (), event.parent
            )
            return replace(
                search, trials=(*search.trials, trial), jobs=(*search.jobs, event.job_id)
            )
        case TrialPromoted():
            jobs = list(search.jobs)
            jobs[event.number] = event.job_id
            search = replace(search, jobs=tuple(jobs))
            return _trial(
                search, event.number, rung=event.rung, budget=event.budget, state=TrialState.RUNNING
            )
        case TrialRungFinished():
            trial = search.trials[event.number]
            top = len(searcher_for(search.spec).rungs) - 1
            state = TrialState.COMPLETED if event.rung >= top else TrialState.PAUSED
            results = (*trial.results, (event.rung, event.metric))
            return _trial(search, event.number, state=state, results=results)
        case TrialFailed():
            return _trial(search, event.number, state=TrialState.FAILED)
        case TrialPruned():
            return _trial(search, event.number, state=TrialState.PRUNED)
        case BestUpdated():
            return replace(search, best=(event.number, event.rung, event.metric))
        case SearchEnded():
            # Trials still running go no further: the search's driver cancels their jobs.
            trials = tuple(
                replace(t, state=TrialState.CANCELLED) if t.state is TrialState.RUNNING else t
                for t in search.trials
            )
            return replace(search, state=event.state, trials=trials)
    raise ValueError(f"not a search event: {type(event).__name__}")


def _trial(search: Search, number: int, **changes: object) -> Search:
    trials = list(search.trials)
    trials[number] = replace(trials[number], **changes)  # type: ignore[arg-type]
    return replace(search, trials=tuple(trials))


@dataclass(frozen=True, slots=True)
class Submit:
    event: SearchSubmitted


@dataclass(frozen=True, slots=True)
class Cancel:
    reason: str
    at: datetime


Command = Submit | Cancel
"""The commands users give; the driver's steps are `advance`'s events, appended at the version
they were decided on."""


class SearchRefused(Exception):
    """A command the search's state does not allow; nothing was written."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


class SearchExists(Exception):
    """A submission of a search that exists (a retry with the same Idempotency-Key)."""


class SearchBusy(Exception):
    """The search's stream kept changing while a command was decided; try again."""


def decide(command: Command, search: Search | None) -> list[SearchEvent]:
    match command:
        case Submit(event=event):
            if search is not None:
                raise SearchExists(f"search {search.search_id} exists")
            return [event, *advance(evolve(None, event), (), event.at)]
    if search is None:
        raise SearchRefused("no such search", not_found=True)
    match command:
        case Cancel(reason=reason, at=at):
            if search.state != "running":
                raise SearchRefused(f"search {search.search_id} has ended ({search.state})")
            return [SearchEnded(at=at, state="cancelled", reason=reason)]
    raise ValueError(f"not a search command: {command!r}")


def _busy(stream_id: str, tries: int) -> Exception:
    return SearchBusy(f"{stream_id} kept changing ({tries} tries); try again")


SEARCH: Aggregate[Command, Search | None, SearchEvent] = Aggregate(
    event_type=SearchEvent, initial=None, decide=decide, evolve=evolve, busy=_busy
)


def advance(search: Search, outcomes: Sequence[Outcome], at: datetime) -> list[SearchEvent]:
    """The events that record `outcomes` (of running trials' jobs that ended) and what the
    search does next; none once it has ended."""
    if search.state != "running":
        return []
    events: list[SearchEvent] = []

    def record(event: SearchEvent) -> None:
        nonlocal search
        events.append(event)
        search = evolve(search, event)

    spec = search.spec
    for outcome in outcomes:
        trial = search.trials[outcome.number]
        if trial.state is not TrialState.RUNNING:
            continue
        if outcome.failure is not None:
            record(TrialFailed(at=at, number=trial.number, reason=outcome.failure))
        elif outcome.metric is None:
            why = f"its job ended without reporting {spec.metric.name}"
            record(TrialFailed(at=at, number=trial.number, reason=why))
        elif not math.isfinite(outcome.metric):
            # A diverged run (a NaN loss): nothing a searcher can rank.
            why = f"its job reported {spec.metric.name} = {outcome.metric}"
            record(TrialFailed(at=at, number=trial.number, reason=why))
        else:
            record(
                TrialRungFinished(
                    at=at, number=trial.number, rung=trial.rung, metric=outcome.metric
                )
            )
    if search.failed > spec.max_failed_trials:
        why = f"{search.failed} trials failed (max_failed_trials is {spec.max_failed_trials})"
        record(SearchEnded(at=at, state="failed", reason=why))
        return events
    found = best(search.trials, spec.metric.mode)
    if found is not None:
        trial, metric = found
        rung = max(r for r, _ in trial.results)
        if search.best != (trial.number, rung, metric):
            record(BestUpdated(at=at, number=trial.number, rung=rung, metric=metric))
    slots = spec.max_concurrent_trials - len(search.running)
    remaining = spec.max_trials - len(search.trials)
    decided = searcher_for(spec).decide(search.trials, slots=slots, remaining=remaining)
    for decision in decided:
        match decision:
            case Create():
                number = len(search.trials)
                record(
                    TrialCreated(
                        at=at,
                        number=number,
                        point=decision.point,
                        budget=decision.budget,
                        job_id=trial_job_id(search.search_id, number, 0),
                        reason=decision.reason,
                        parent=decision.parent,
                    )
                )
            case Promote():
                job_id = trial_job_id(search.search_id, decision.trial, decision.rung)
                record(
                    TrialPromoted(
                        at=at,
                        number=decision.trial,
                        rung=decision.rung,
                        budget=decision.budget,
                        job_id=job_id,
                        reason=decision.reason,
                    )
                )
            case Prune():
                record(TrialPruned(at=at, number=decision.trial, reason=decision.reason))
    waiting = any(t.state is TrialState.PAUSED for t in search.trials)
    if (
        not search.running
        and not waiting
        and not any(isinstance(d, Create | Promote) for d in decided)
    ):
        done = sum(t.state is TrialState.COMPLETED for t in search.trials)
        record(SearchEnded(at=at, state="completed", reason=f"{done} trials completed"))
    return events
