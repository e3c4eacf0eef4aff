"""A search's trials as its searcher sees them, and what a searcher may decide: pure values.

A trial is created at rung 0 with a budget (steps or epochs, as the search counts them). When
its learner has trained that far it reports the metric and the trial is paused at that rung, or
completed at the top one; a searcher may promote a paused trial to the next rung (it resumes
from its checkpoint with the larger budget) or prune it. Searchers without rungs (random, grid,
evolution) give every trial the whole budget: one rung, the top."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

Mode = Literal["max", "min"]


class TrialState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    """It reached its rung's budget; promoted, it resumes; else it stays, or is pruned."""
    COMPLETED = "completed"
    FAILED = "failed"
    PRUNED = "pruned"
    CANCELLED = "cancelled"
    """The search ended (cancelled, or failed) while it ran: its job is cancelled."""


@dataclass(frozen=True, slots=True)
class Trial:
    number: int
    point: dict[str, Any]
    rung: int
    budget: int
    state: TrialState
    results: tuple[tuple[int, float], ...] = ()
    """The metric it reported at each rung it finished, in rung order."""
    parent: int | None = None
    """The trial it was mutated from (evolution)."""

    def result(self, rung: int) -> float | None:
        return next((metric for r, metric in self.results if r == rung), None)


@dataclass(frozen=True, slots=True)
class Create:
    point: dict[str, Any]
    budget: int
    reason: str
    parent: int | None = None


@dataclass(frozen=True, slots=True)
class Promote:
    trial: int
    rung: int
    budget: int
    reason: str


@dataclass(frozen=True, slots=True)
class Prune:
    trial: int
    reason: str


Decision = Create | Promote | Prune


def score(metric: float, mode: Mode) -> float:
    """Higher is better, whatever the mode."""
    return metric if mode == "max" else -metric


def best(trials: Sequence[Trial], mode: Mode) -> tuple[Trial, float] | None:
    """The trial with the best metric at the highest rung any trial reached (a metric at a
    smaller budget does not compete with one at a larger), ties to the earlier trial."""
    reached = [(rung, t, m) for t in trials for rung, m in t.results]
    if not reached:
        return None
    top = max(rung for rung, _, _ in reached)
    rung_best = max(
        ((t, m) for rung, t, m in reached if rung == top),
        key=lambda entry: (score(entry[1], mode), -entry[0].number),
    )
    return rung_best
