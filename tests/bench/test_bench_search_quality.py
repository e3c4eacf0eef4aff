"""The search-quality figures, briefly: the digits example's search is a valid search, and small
runs of ASHA against random search (and of Optuna, where it is installed) give consistent
figures. The figures themselves are for `bench/`: a run this small says nothing about them."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from bench.search_quality import asha_compute_ratio, optuna_comparison
from controlplane.searches.searchers import Asha
from controlplane.searches.spec import SearchSpec, searcher_for


def test_the_examples_search_is_valid_and_runs_asha_over_three_rungs() -> None:
    text = (resources.files("runners.examples") / "digits_search.yaml").read_text()
    spec = SearchSpec.model_validate(yaml.safe_load(text))
    searcher = searcher_for(spec)
    assert isinstance(searcher, Asha) and searcher.rungs == (3, 9, 27)
    assert spec.trial.command == ["python", "-m", "runners.examples.digits"]
    assert (spec.metric.name, spec.metric.mode, spec.budget.unit) == ("accuracy", "max", "epochs")


def test_a_small_asha_against_random_run_gives_consistent_figures() -> None:
    result = asha_compute_ratio(trials=6, seed=1, max_budget=4, min_budget=1, reduction=2)
    assert result["random_compute_epochs"] == 6 * 4
    # ASHA trains at most what random search does: 6 trials at rung 0, the best half on.
    assert 0 < result["asha_compute_epochs"] <= result["random_compute_epochs"]
    assert 0 < result["asha_compute_to_random_best_epochs"] <= result["asha_compute_epochs"]
    assert 0 < result["asha_compute_ratio"] <= 1
    assert result["asha_compute_ratio"] == (
        result["asha_compute_to_random_best_epochs"] / result["random_compute_epochs"]
    )
    assert 0 <= result["random_best_accuracy"] <= 1 and 0 <= result["best_accuracy"] <= 1
    assert isinstance(result["asha_reached_random_best"], bool)


def test_a_small_optuna_run_gives_consistent_figures() -> None:
    pytest.importorskip("optuna")
    result = optuna_comparison(trials=4, seed=1, max_budget=3, min_budget=1, reduction=3)
    assert 0 <= result["optuna_best_accuracy"] <= 1
    assert 3 <= result["optuna_compute_epochs"] <= 4 * 3
    assert 0 <= result["optuna_pruned_trials"] < 4
