"""How good a searcher is on the digits architecture search (`runners/examples/digits.py`, its
space in `runners/examples/digits_search.yaml`), measured in-process: no database, no agents,
every trial trained for real.

`asha_compute_ratio` drives the search's real pure lifecycle (`controlplane.searches.lifecycle`:
`advance` decides, `evolve` folds the events) twice, with ASHA and with random search, on the
same trial count and seed. Trials run `slots` at a time on a simulated clock where one epoch
takes one unit: a job's trial is trained when the search starts the job (the result does not
depend on when, as each epoch's randomness comes from the seed and the epoch alone), and its
outcome reaches the search at its simulated end. A promoted trial goes on from its model and
optimizer as its previous rung left them, kept in memory, as a real trial resumes from its
checkpoint.

Fair by construction: both searchers draw trial k's point from the same generator (seed, k) when
one trial is created at a time (`slots` = 1, the default; with more, the sequences can part), all
trials share the data split, the initial weights of a point and the batches, and the learning
rate is constant, so a trial ASHA trains to the full budget ends exactly as random search's same
trial does. What ASHA saves is the compute it gives the trials it stops early.

`optuna_comparison` runs Optuna's TPE sampler with its successive-halving pruner on the same
space, budget and trial count, for context.
"""

from __future__ import annotations

import heapq
import importlib
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import reduce
from importlib import resources
from typing import Any
from uuid import UUID

import torch
import yaml

from controlplane.searches.events import (
    BestUpdated,
    SearchEvent,
    SearchSubmitted,
    TrialCreated,
    TrialPromoted,
)
from controlplane.searches.lifecycle import Outcome, Search, advance, evolve
from controlplane.searches.space import Choice, Integer, Leaf, LogUniform, Repeat, Space, Uniform
from controlplane.searches.spec import SearchSpec
from controlplane.searches.trials import TrialState
from runners.examples import digits

SPEC_FILE = "digits_search.yaml"
"""The example's search, in the `runners.examples` package: its space and metric are measured."""
START = datetime(2026, 1, 1, tzinfo=UTC)
"""Simulated time zero (the events' `at`); an epoch is a second."""


def digits_spec(
    searcher: dict[str, Any], *, trials: int, slots: int, max_budget: int
) -> SearchSpec:
    """The example's search with another searcher, trial count, concurrency and budget."""
    raw = yaml.safe_load((resources.files("runners.examples") / SPEC_FILE).read_text())
    raw.update(
        searcher=searcher,
        max_trials=trials,
        max_concurrent_trials=slots,
        budget={"unit": "epochs", "max": max_budget},
    )
    return SearchSpec.model_validate(raw)


def asha_compute_ratio(
    trials: int = 27,
    seed: int = 0,
    *,
    slots: int = 1,
    max_budget: int = 27,
    min_budget: int = 3,
    reduction: int = 3,
) -> dict[str, Any]:
    """Random search and ASHA on the digits search, same trials and seed.

    `asha_compute_ratio` is the compute (epochs trained, every trial's together) ASHA had spent
    when the best metric its search recorded (`BestUpdated`) first reached random search's best
    validation accuracy, over random search's total compute; when ASHA never reached it, its
    total compute, with `asha_reached_random_best` false.
    """
    started = time.perf_counter()
    with _one_thread():
        data = digits.load(seed)
        random = _drive(
            digits_spec(
                {"name": "random", "seed": seed},
                trials=trials,
                slots=slots,
                max_budget=max_budget,
            ),
            data,
            seed,
        )
        asha = _drive(
            digits_spec(
                {"name": "asha", "min_budget": min_budget, "reduction": reduction, "seed": seed},
                trials=trials,
                slots=slots,
                max_budget=max_budget,
            ),
            data,
            seed,
        )
    target = random.best
    reached = next((spent for spent, metric in asha.bests if metric >= target), None)
    spent = asha.compute if reached is None else reached
    return {
        "trials": trials,
        "seed": seed,
        "slots": slots,
        "budget_epochs": max_budget,
        "min_budget_epochs": min_budget,
        "reduction": reduction,
        "random_best_accuracy": random.best,
        "best_accuracy": asha.best,
        "random_compute_epochs": random.compute,
        "asha_compute_epochs": asha.compute,
        "asha_compute_to_random_best_epochs": spent,
        "asha_reached_random_best": reached is not None,
        "asha_compute_ratio": spent / random.compute,
        "wall_s": time.perf_counter() - started,
    }


@dataclass
class _Trained:
    """A trial's training as its last job left it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    point: digits.Hparams
    epochs: int = 0


@dataclass
class _Run:
    """What one search did."""

    best: float = math.nan
    """The search's best metric when it ended."""
    compute: int = 0
    bests: list[tuple[int, float]] = field(default_factory=list)
    """(compute spent, metric) at each BestUpdated, in order."""


def _drive(spec: SearchSpec, data: digits.Digits, seed: int) -> _Run:
    """The search run to its end on the simulated clock (see the module's description)."""
    submitted = SearchSubmitted(at=START, search_id=UUID(int=seed), tenant="bench", spec=spec)
    search = evolve(None, submitted)
    run = _Run()
    trained: dict[int, _Trained] = {}
    jobs: list[tuple[int, int]] = []  # (start, end) of every job started, on the clock
    running: list[tuple[int, int, float]] = []  # (end, trial, metric), a heap
    now = 0

    def record(events: list[SearchEvent]) -> Search:
        folded = reduce(evolve, events, search)
        for event in events:
            if isinstance(event, TrialCreated | TrialPromoted):
                point = folded.trials[event.number].point
                metric, epochs = _train(trained, event.number, point, event.budget, data, seed)
                jobs.append((now, now + epochs))
                heapq.heappush(running, (now + epochs, event.number, metric))
            elif isinstance(event, BestUpdated):
                # The compute spent by now: jobs still running count the epochs they have done.
                spent = sum(min(now, end) - start for start, end in jobs)
                run.bests.append((spent, event.metric))
        for trial in folded.trials:
            if trial.state in (TrialState.COMPLETED, TrialState.PRUNED):
                trained.pop(trial.number, None)  # it trains no more
        return folded

    search = record(advance(search, [], START))
    while search.state == "running":
        now, number, metric = heapq.heappop(running)
        at = START + timedelta(seconds=now)
        search = record(advance(search, [Outcome(number, metric)], at))
    run.compute = sum(end - start for start, end in jobs)
    run.best = math.nan if search.best is None else search.best[2]
    return run


def _train(
    trained: dict[int, _Trained],
    number: int,
    point: dict[str, Any],
    budget: int,
    data: digits.Digits,
    seed: int,
) -> tuple[float, int]:
    """Train the trial on to `budget` epochs, from where its previous job left it; its
    validation accuracy then, and the epochs this job trained."""
    trial = trained.get(number)
    if trial is None:
        hparams = digits.parse(point)
        model = digits.build(hparams, seed)
        trial = trained[number] = _Trained(model, digits.optimizer_for(model, hparams), hparams)
    epochs = budget - trial.epochs
    digits.train_epochs(
        trial.model, trial.optimizer, data, trial.point, start=trial.epochs, end=budget, seed=seed
    )
    trial.epochs = budget
    return digits.evaluate(trial.model, data), epochs


@contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one thread for the block: the networks are too small for more to pay, and two
    cores' worth of threads fighting over a small machine make timings noisy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def optuna_comparison(
    trials: int = 27,
    seed: int = 0,
    *,
    max_budget: int = 27,
    min_budget: int = 3,
    reduction: int = 3,
) -> dict[str, Any]:
    """Optuna's TPE sampler (seeded) with its successive-halving pruner (rungs at `min_budget`
    times powers of `reduction` epochs, as ASHA's) on the same space, data split, networks and
    training as `asha_compute_ratio`: its best validation accuracy among the trials trained to
    the full budget, and its compute (epochs trained, every trial's together). Needs Optuna
    (the `bench` extra); ModuleNotFoundError saying so without it."""
    try:
        # By name: Optuna is the `bench` extra's, which the tests' install (and CI's mypy) lacks.
        optuna = importlib.import_module("optuna")
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "optuna_comparison needs Optuna: pip install -e '.[bench]'", name="optuna"
        ) from error
    started = time.perf_counter()
    space = digits_spec({"name": "random"}, trials=trials, slots=1, max_budget=max_budget).space
    data = digits.load(seed)
    compute = 0

    def objective(trial: Any) -> float:
        nonlocal compute
        hparams = digits.parse(_suggest(trial, space))
        model = digits.build(hparams, seed)
        optimizer = digits.optimizer_for(model, hparams)
        accuracy = math.nan
        for epoch in range(max_budget):
            digits.train_epoch(model, optimizer, data, hparams, epoch=epoch, seed=seed)
            compute += 1
            accuracy = digits.evaluate(model, data)
            trial.report(accuracy, epoch + 1)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return accuracy

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with _one_thread():
            study = optuna.create_study(
                direction="maximize",
                sampler=optuna.samplers.TPESampler(seed=seed),
                pruner=optuna.pruners.SuccessiveHalvingPruner(
                    min_resource=min_budget, reduction_factor=reduction
                ),
            )
            study.optimize(objective, n_trials=trials)
    finally:
        optuna.logging.set_verbosity(verbosity)
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
    return {
        "trials": trials,
        "seed": seed,
        "optuna_version": optuna.__version__,
        "optuna_best_accuracy": float(study.best_value),
        "optuna_compute_epochs": compute,
        "optuna_pruned_trials": pruned,
        "wall_s": time.perf_counter() - started,
    }


def _suggest(trial: Any, space: Space) -> dict[str, Any]:
    """A point of `space` as an Optuna trial suggests it (a `repeat`'s count and each item's
    values as parameters of their own)."""
    point: dict[str, Any] = {}
    for name, param in space.params.items():
        if isinstance(param, Repeat):
            count = trial.suggest_int(f"{name}.count", param.min, param.max)
            point[name] = [
                {key: _suggest_leaf(trial, f"{name}.{i}.{key}", p) for key, p in param.item.items()}
                for i in range(count)
            ]
        else:
            point[name] = _suggest_leaf(trial, name, param)
    return point


def _suggest_leaf(trial: Any, name: str, param: Leaf) -> Any:
    match param:
        case Uniform():
            return trial.suggest_float(name, param.low, param.high)
        case LogUniform():
            return trial.suggest_float(name, param.low, param.high, log=True)
        case Integer():
            return trial.suggest_int(name, param.low, param.high)
        case Choice():
            return trial.suggest_categorical(name, param.values)
