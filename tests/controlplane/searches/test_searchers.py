"""Searchers, pure: what each decides from a search's trials, with its reasons; the same
trials always decide the same."""

from __future__ import annotations

from dataclasses import replace

from controlplane.searches.searchers import Asha, Evolution, GridSearch, RandomSearch
from controlplane.searches.space import Space, contains
from controlplane.searches.trials import Create, Promote, Prune, Trial, TrialState, best

SPACE = Space.model_validate(
    {
        "params": {
            "lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-1},
            "layers": {
                "type": "repeat",
                "min": 1,
                "max": 3,
                "item": {"width": {"type": "int", "low": 8, "high": 64}},
            },
        }
    }
)


def created(decisions: list[object]) -> list[Create]:
    assert all(isinstance(d, Create) for d in decisions)
    return [d for d in decisions if isinstance(d, Create)]


def trial(number: int, state: TrialState, rung: int = 0, *results: float) -> Trial:
    return Trial(
        number,
        {"lr": 0.01, "layers": [{"width": 8}]},
        rung,
        1,
        state,
        tuple(enumerate(results)),
    )


def test_random_and_grid_fill_the_free_slots_within_the_trials_left() -> None:
    randomly = RandomSearch(SPACE, budget=10, seed=1)
    first = created(randomly.decide([], slots=3, remaining=2))
    assert len(first) == 2 and all(contains(SPACE, c.point) and c.budget == 10 for c in first)
    assert randomly.decide([], slots=3, remaining=2) == first  # asked again: the same
    grid = GridSearch(SPACE, budget=10, points=2)  # 2 lr values x 3 layer counts
    done = [trial(k, TrialState.COMPLETED, 0, 0.5) for k in range(4)]
    rest = created(grid.decide(done, slots=5, remaining=10))
    assert [c.reason for c in rest] == ["grid point 5 of 6", "grid point 6 of 6"]


def test_asha_promotes_the_top_third_of_a_rung_and_prunes_the_rest_at_the_end() -> None:
    asha = Asha(SPACE, "max", min_budget=1, max_budget=9, reduction=3, seed=2)
    assert asha.rungs == (1, 3, 9)
    # Six trials finished rung 0: the top 1/3 (two) may go on, the best first.
    trials = [
        trial(k, TrialState.PAUSED, 0, metric)
        for k, metric in enumerate([0.2, 0.9, 0.5, 0.7, 0.1, 0.3])
    ]
    decisions = asha.decide(trials, slots=3, remaining=1)
    assert decisions[:2] == [
        Promote(1, 1, 3, "in the top 1/3 of the 6 trials that finished rung 0 (0.9)"),
        Promote(3, 1, 3, "in the top 1/3 of the 6 trials that finished rung 0 (0.7)"),
    ]
    assert isinstance(decisions[2], Create) and decisions[2].budget == 1
    # A higher rung's promotion comes first: trial 1 finished rung 1, alone in its top third
    # once three have.
    trials[1] = replace(trials[1], rung=1, results=((0, 0.9), (1, 0.95)))
    trials[3] = replace(trials[3], rung=1, results=((0, 0.7), (1, 0.6)), state=TrialState.PAUSED)
    trials.append(replace(trial(6, TrialState.PAUSED, 1, 0.8), results=((0, 0.8), (1, 0.5))))
    [first, *_] = asha.decide(trials, slots=1, remaining=0)
    assert first == Promote(1, 2, 9, "in the top 1/3 of the 3 trials that finished rung 1 (0.95)")
    # Nothing may be created, nothing runs, nobody else is promotable: the rest are pruned.
    trials[1] = replace(
        trials[1], rung=2, state=TrialState.COMPLETED, results=((0, 0.9), (1, 0.95), (2, 0.97))
    )
    pruned = asha.decide(trials, slots=2, remaining=0)
    assert all(isinstance(p, Prune) for p in pruned)
    assert {p.trial for p in pruned if isinstance(p, Prune)} == {0, 2, 3, 4, 5, 6}
    assert best(trials, "max") == (trials[1], 0.97)


def test_asha_with_a_running_trial_waits_rather_than_prunes() -> None:
    asha = Asha(SPACE, "min", min_budget=1, max_budget=4, reduction=2, seed=2)
    assert asha.rungs == (1, 2, 4)
    trials = [trial(0, TrialState.PAUSED, 0, 0.4), trial(1, TrialState.RUNNING)]
    assert asha.decide(trials, slots=1, remaining=0) == []


def test_evolution_mutates_the_best_of_a_sample_of_the_newest_completed() -> None:
    evolution = Evolution(SPACE, "max", budget=5, population=4, sample=4, seed=3)
    first = created(evolution.decide([], slots=2, remaining=10))
    assert [c.reason for c in first] == [
        "the first population (1 of 4)",
        "the first population (2 of 4)",
    ]
    done = [
        Trial(k, c.point, 0, 5, TrialState.COMPLETED, ((0, metric),))
        for k, (c, metric) in enumerate(
            zip(
                created(evolution.decide([], slots=4, remaining=4)),
                [0.1, 0.8, 0.3, 0.2],
                strict=True,
            )
        )
    ]
    [child] = created(evolution.decide(done, slots=1, remaining=1))
    assert child.parent == 1  # the sample is the whole population: its best
    assert child.reason == "a mutation of trial 1, the best of 4 drawn from the newest 4 completed"
    assert contains(SPACE, child.point) and child.point != done[1].point
    # The oldest age out: with a population of two, only trials 2 and 3 may be parents.
    aging = Evolution(SPACE, "max", budget=5, population=2, sample=2, seed=3)
    [young] = created(aging.decide(done, slots=1, remaining=1))
    assert young.parent == 2
