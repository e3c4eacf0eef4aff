"""Searchers: pure functions of a search's trials to what it does next, behind one small
interface. Each decision carries its reason, which the search records with it.

A searcher's randomness is drawn from its seed and how many trials exist, so asking again
before its decisions are recorded (a control plane killed in between) decides the same."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from controlplane.searches.space import Space, grid_point, grid_size, mutate, sample
from controlplane.searches.trials import (
    Create,
    Decision,
    Mode,
    Promote,
    Prune,
    Trial,
    TrialState,
    score,
)


class Searcher(Protocol):
    @property
    def rungs(self) -> tuple[int, ...]:
        """The budgets of its rungs, smallest first; the last is the search's whole budget."""
        ...

    def decide(self, trials: Sequence[Trial], *, slots: int, remaining: int) -> list[Decision]:
        """What to do with `slots` trials' room free (at most that many created or promoted)
        and `remaining` trials still allowed to be created."""
        ...


def _rng(seed: int, trials: Sequence[Trial]) -> random.Random:
    return random.Random(f"{seed}:{len(trials)}")


@dataclass(frozen=True, slots=True)
class RandomSearch:
    space: Space
    budget: int
    seed: int

    @property
    def rungs(self) -> tuple[int, ...]:
        return (self.budget,)

    def decide(self, trials: Sequence[Trial], *, slots: int, remaining: int) -> list[Decision]:
        rng = _rng(self.seed, trials)
        count = min(slots, remaining)
        return [
            Create(sample(self.space, rng), self.budget, "drawn at random") for _ in range(count)
        ]


@dataclass(frozen=True, slots=True)
class GridSearch:
    space: Space
    budget: int
    points: int
    """Values of each real parameter (evenly spread, geometrically for log_uniform)."""

    @property
    def rungs(self) -> tuple[int, ...]:
        return (self.budget,)

    def decide(self, trials: Sequence[Trial], *, slots: int, remaining: int) -> list[Decision]:
        size = grid_size(self.space, self.points)
        first = len(trials)
        count = max(min(slots, remaining, size - first), 0)
        return [
            Create(
                grid_point(self.space, k, self.points), self.budget, f"grid point {k + 1} of {size}"
            )
            for k in range(first, first + count)
        ]


@dataclass(frozen=True, slots=True)
class Asha:
    """Asynchronous successive halving (Li et al., 2020): a free slot promotes a paused trial
    that is in the top 1/reduction of those that finished its rung, the highest rung first;
    else it starts a new trial at the smallest budget. Once no trial may be created and none
    runs, the paused trials that were never promoted are pruned."""

    space: Space
    mode: Mode
    min_budget: int
    max_budget: int
    reduction: int
    seed: int

    @property
    def rungs(self) -> tuple[int, ...]:
        steps = math.ceil(math.log(self.max_budget / self.min_budget, self.reduction) - 1e-9)
        budgets = [
            min(self.min_budget * self.reduction**k, self.max_budget) for k in range(steps + 1)
        ]
        return tuple(dict.fromkeys(budgets))

    def decide(self, trials: Sequence[Trial], *, slots: int, remaining: int) -> list[Decision]:
        rng = _rng(self.seed, trials)
        rungs = self.rungs
        decided: list[Decision] = []
        promoted: set[int] = set()
        for _ in range(slots):
            chosen = self._promotable(trials, promoted)
            if chosen is not None:
                trial, finished, of = chosen
                promoted.add(trial.number)
                reason = (
                    f"in the top 1/{self.reduction} of the {of} trials that finished rung "
                    f"{trial.rung} ({finished:g})"
                )
                decided.append(Promote(trial.number, trial.rung + 1, rungs[trial.rung + 1], reason))
            elif remaining > 0:
                remaining -= 1
                decided.append(Create(sample(self.space, rng), rungs[0], "a new trial at rung 0"))
            else:
                break
        running = any(t.state is TrialState.RUNNING for t in trials)
        if not decided and not running and remaining == 0:
            decided = [
                Prune(t.number, f"not in the top 1/{self.reduction} at rung {t.rung}")
                for t in trials
                if t.state is TrialState.PAUSED
            ]
        return decided

    def _promotable(
        self, trials: Sequence[Trial], promoted: set[int]
    ) -> tuple[Trial, float, int] | None:
        """The best paused trial, at the highest rung below the top, that is in the top
        1/reduction of the trials that finished its rung; with its metric and how many did."""
        for rung in reversed(range(len(self.rungs) - 1)):
            finished = [(t, m) for t in trials if (m := t.result(rung)) is not None]
            finished.sort(key=lambda entry: (-score(entry[1], self.mode), entry[0].number))
            top = finished[: len(finished) // self.reduction]
            for trial, metric in top:
                waiting = trial.state is TrialState.PAUSED and trial.rung == rung
                if waiting and trial.number not in promoted:
                    return trial, metric, len(finished)
        return None


@dataclass(frozen=True, slots=True)
class Evolution:
    """Regularized evolution (Real et al., 2019): a first population drawn at random; then each
    new trial is a mutation of the best of `sample` trials drawn from the newest `population`
    that completed (the older ones age out, however good they were)."""

    space: Space
    mode: Mode
    budget: int
    population: int
    sample: int
    seed: int

    @property
    def rungs(self) -> tuple[int, ...]:
        return (self.budget,)

    def decide(self, trials: Sequence[Trial], *, slots: int, remaining: int) -> list[Decision]:
        rng = _rng(self.seed, trials)
        completed = [t for t in trials if t.state is TrialState.COMPLETED]
        newest = completed[-self.population :]
        decided: list[Decision] = []
        created = len(trials)
        for _ in range(min(slots, remaining)):
            if created < self.population or not newest:
                why = f"the first population ({created + 1} of {self.population})"
                if created >= self.population:
                    why = "no trial has completed yet to evolve from"
                decided.append(Create(sample(self.space, rng), self.budget, why))
            else:
                drawn = rng.sample(newest, min(self.sample, len(newest)))
                parent = max(drawn, key=lambda t: (score(t.results[-1][1], self.mode), -t.number))
                reason = (
                    f"a mutation of trial {parent.number}, the best of {len(drawn)} drawn from "
                    f"the newest {len(newest)} completed"
                )
                child = mutate(self.space, parent.point, rng)
                decided.append(Create(child, self.budget, reason, parent=parent.number))
            created += 1
        return decided
