"""A search as submitted: a hostile one is refused whole with its fields named; a good one
gives the searcher it names."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from controlplane.searches.searchers import Asha, Evolution, GridSearch, RandomSearch
from controlplane.searches.spec import SearchSpec, searcher_for

SEARCH: dict[str, Any] = {
    "name": "digits-nas",
    "trial": {"name": "trial", "image": "trainyard-learner", "command": ["python", "train.py"]},
    "space": {"params": {"lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-1}}},
    "searcher": {"name": "asha", "min_budget": 1, "reduction": 3, "seed": 7},
    "metric": {"name": "accuracy", "mode": "max"},
    "budget": {"unit": "epochs", "max": 27},
    "max_trials": 64,
    "max_concurrent_trials": 2,
}


def spec(**changes: Any) -> SearchSpec:
    return SearchSpec.model_validate({**SEARCH, **changes})


def test_each_searcher_is_built_from_its_spec() -> None:
    asha = searcher_for(spec())
    assert isinstance(asha, Asha) and asha.rungs == (1, 3, 9, 27)
    assert isinstance(searcher_for(spec(searcher={"name": "random"})), RandomSearch)
    grid = searcher_for(spec(searcher={"name": "grid", "points": 4}))
    assert isinstance(grid, GridSearch) and grid.points == 4
    evolution = searcher_for(spec(searcher={"name": "evolution", "population": 8, "sample": 3}))
    assert isinstance(evolution, Evolution) and evolution.rungs == (27,)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"searcher": {"name": "asha", "min_budget": 27}}, ""),
        ({"searcher": {"name": "evolution", "population": 2, "sample": 3}}, "searcher.evolution"),
        ({"searcher": {"name": "hyperband"}}, "searcher"),
        ({"metric": {"name": "acc; DROP TABLE", "mode": "max"}}, "metric.name"),
        ({"metric": {"name": "accuracy", "mode": "best"}}, "metric.mode"),
        ({"budget": {"unit": "hours", "max": 3}}, "budget.unit"),
        ({"max_trials": 0}, "max_trials"),
        ({"max_concurrent_trials": 10_000}, "max_concurrent_trials"),
        ({"trial": {**SEARCH["trial"], "env": {"TRAINYARD_HPARAMS": "{}"}}}, "trial.env"),
        ({"trial": {**SEARCH["trial"], "surprise": 1}}, "trial.surprise"),
        ({"space": {"params": {}}}, "space.params"),
        ({"extra": True}, "extra"),
    ],
)
def test_a_bad_search_is_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        spec(**changes)
    located = {".".join(str(part) for part in error["loc"]) for error in refused.value.errors()}
    assert any(loc.startswith(field) for loc in located), located


def test_a_grid_too_large_to_run_is_refused() -> None:
    params = {f"p{k}": {"type": "uniform", "low": 0, "high": 1} for k in range(10)}
    with pytest.raises(ValidationError, match="the grid has more than 10000 points"):
        spec(space={"params": params}, searcher={"name": "grid", "points": 3})
