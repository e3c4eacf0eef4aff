"""A search's lifecycle, pure: driven to its end with trials whose metric is a function of their
point and budget, it records every decision once, ends, and its state is its events folded."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from functools import reduce
from typing import Any
from uuid import UUID

from controlplane.searches.events import (
    BestUpdated,
    SearchEnded,
    SearchEvent,
    SearchSubmitted,
    TrialCreated,
    TrialFailed,
    TrialPromoted,
    TrialPruned,
)
from controlplane.searches.lifecycle import Outcome, Search, advance, evolve, trial_job_id
from controlplane.searches.spec import SearchSpec
from controlplane.searches.trials import TrialState
from tests.controlplane.searches.test_spec import SEARCH

AT = datetime(2026, 11, 27, tzinfo=UTC)
SEARCH_ID = UUID(int=42)


def accuracy(point: dict[str, Any], budget: int) -> float:
    """Best near lr = 1e-2, better with more budget."""
    return 1 - (math.log10(point["lr"]) + 2) ** 2 / 10 - 1 / (1 + budget)


Step = tuple[list[Outcome], list[SearchEvent]]


def steps(spec: dict[str, Any], fail: frozenset[int] = frozenset()) -> list[Step]:
    """The search driven to its end: each call of `advance`, with the outcomes it was given
    (every running trial's job ends between calls) and the events it returned."""
    submitted = SearchSubmitted(
        at=AT, search_id=SEARCH_ID, tenant="acme", spec=SearchSpec.model_validate(spec)
    )
    done: list[Step] = [([], [submitted])]
    search = evolve(None, submitted)
    for _ in range(1000):
        outcomes = [
            Outcome(t.number, failure="exit code 1")
            if t.number in fail
            else Outcome(t.number, metric=accuracy(t.point, t.budget))
            for t in search.running
        ]
        more = advance(search, outcomes, AT)
        done.append((outcomes, more))
        search = reduce(evolve, more, search)
        if search.state != "running":
            return done
    raise AssertionError("the search never ended")


def run(spec: dict[str, Any], fail: frozenset[int] = frozenset()) -> list[SearchEvent]:
    return [event for _, events in steps(spec, fail) for event in events]


def fold(events: list[SearchEvent]) -> Search:
    return reduce(evolve, events[1:], evolve(None, events[0]))


def test_an_asha_search_runs_to_its_end_promoting_the_best_and_pruning_the_rest() -> None:
    events = run(SEARCH)
    search = fold(events)
    assert search.state == "completed"
    assert len(search.trials) == SEARCH["max_trials"]
    created = [e for e in events if isinstance(e, TrialCreated)]
    promoted = [e for e in events if isinstance(e, TrialPromoted)]
    assert [e.number for e in created] == list(range(64))
    assert {e.job_id for e in created} | {e.job_id for e in promoted} == {
        trial_job_id(SEARCH_ID, e.number, getattr(e, "rung", 0)) for e in [*created, *promoted]
    }
    assert len({e.job_id for e in [*created, *promoted]}) == len(created) + len(promoted)
    assert all(e.budget == 1 for e in created) and {e.budget for e in promoted} == {3, 9, 27}
    states = {t.state for t in search.trials}
    assert states == {TrialState.COMPLETED, TrialState.PRUNED}
    assert all(
        e.reason.startswith("not in the top 1/3") for e in events if isinstance(e, TrialPruned)
    )
    # The best is the best completed at the top rung, and about the best lr.
    assert search.best is not None
    number, rung, metric = search.best
    assert rung == 3
    top = [t.result(3) for t in search.trials if t.result(3) is not None]
    assert metric == max(m for m in top if m is not None)
    assert abs(math.log10(search.trials[number].point["lr"]) + 2) < 0.5
    # Far less compute than 64 trials at the whole budget.
    spent = sum(e.budget for e in created) + sum(e.budget for e in promoted)
    assert spent < 64 * 27 / 3
    assert run(SEARCH) == events  # deterministic


def test_a_search_rebuilt_from_its_events_decides_what_it_decided() -> None:
    # A control plane killed after any step (each step's events are appended together) comes
    # back with the search folded from the events before, and, given the same outcomes,
    # records exactly what the first one did: no trial lost, none created twice.
    done = steps(SEARCH)
    recorded: list[SearchEvent] = []
    for outcomes, events in done[1:]:
        recorded += done[0][1] if not recorded else []
        assert advance(fold(recorded), outcomes, AT) == events
        recorded += events


def test_failed_trials_beyond_the_limit_fail_the_search() -> None:
    limited = {**SEARCH, "searcher": {"name": "random", "seed": 1}, "max_failed_trials": 1}
    events = run(limited, fail=frozenset({0, 1}))
    assert isinstance(events[-1], SearchEnded) and events[-1].state == "failed"
    assert events[-1].reason == "2 trials failed (max_failed_trials is 1)"


def test_a_diverged_trial_fails_and_is_never_the_best() -> None:
    """A NaN or infinite metric (a loss that diverged) ranks nothing: its trial fails, with the
    value in its reason, and no event ever carries it."""
    spec = {**SEARCH, "searcher": {"name": "random", "seed": 1}, "max_failed_trials": 5}
    submitted = SearchSubmitted(
        at=AT, search_id=SEARCH_ID, tenant="acme", spec=SearchSpec.model_validate(spec)
    )
    search = reduce(evolve, advance(evolve(None, submitted), [], AT), evolve(None, submitted))
    first, second = search.running[:2]
    outcomes = [Outcome(first.number, metric=math.nan), Outcome(second.number, metric=math.inf)]
    events = advance(search, outcomes, AT)
    failed = [e for e in events if isinstance(e, TrialFailed)]
    assert [e.number for e in failed] == [first.number, second.number]
    assert "= nan" in failed[0].reason and "= inf" in failed[1].reason
    assert not any(isinstance(e, BestUpdated) for e in events)
