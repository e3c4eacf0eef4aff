"""Search spaces: hostile ones are refused with the field named; draws, grid points and
mutations always stay inside the space, and the same seed draws the same."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from controlplane.event_registry import EVENT_REGISTRY
from controlplane.jobs.manifest import MIN_CPUS
from controlplane.searches.events import SearchSubmitted
from controlplane.searches.space import (
    MIN_LOG_BOUND,
    Space,
    contains,
    grid_point,
    grid_size,
    max_point_chars,
    mutate,
    sample,
)
from controlplane.searches.spec import SearchSpec, stored_spec
from tests.controlplane.searches.test_spec import SEARCH

ARCHITECTURE: dict[str, Any] = {
    "params": {
        "lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-1},
        "dropout": {"type": "uniform", "low": 0.0, "high": 0.5},
        "batch": {"type": "choice", "values": [32, 64, 128]},
        "layers": {
            "type": "repeat",
            "min": 1,
            "max": 3,
            "item": {
                "width": {"type": "int", "low": 16, "high": 256},
                "activation": {"type": "choice", "values": ["relu", "tanh"]},
            },
        },
    }
}


def space() -> Space:
    return Space.model_validate(ARCHITECTURE)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"lr": {"type": "uniform", "low": 1, "high": 1}}, "params.lr.uniform"),
        ({"lr": {"type": "log_uniform", "low": 0, "high": 1}}, "params.lr.log_uniform.low"),
        ({"lr": {"type": "uniform", "low": 0, "high": 1e300}}, "params.lr.uniform.high"),
        ({"lr": {"type": "uniform", "low": 0, "high": float("nan")}}, "params.lr.uniform.high"),
        ({"n": {"type": "int", "low": 3, "high": 2}}, "params.n.int"),
        ({"n": {"type": "choice", "values": []}}, "params.n.choice.values"),
        ({"n": {"type": "choice", "values": list(range(65))}}, "params.n.choice.values"),
        ({"n": {"type": "repeat", "min": 1, "max": 17, "item": {}}}, "params.n.repeat.max"),
        ({"Bad-Name": {"type": "int", "low": 0, "high": 1}}, "params.Bad-Name.[key]"),
        ({"n": {"type": "gaussian"}}, "params.n"),
        (
            {"n": {"type": "repeat", "min": 1, "max": 2, "item": {"m": {"type": "repeat"}}}},
            "params.n.repeat.item.m",
        ),
    ],
)
def test_a_bad_space_is_refused_naming_the_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Space.model_validate({"params": params})
    located = {".".join(str(part) for part in error["loc"]) for error in refused.value.errors()}
    assert any(loc.startswith(field) for loc in located), located


@given(st.integers(0, 2**32))
def test_draws_and_mutations_stay_in_the_space(seed: int) -> None:
    rng = random.Random(seed)
    point = sample(space(), rng)
    assert contains(space(), point)
    for _ in range(5):
        child = mutate(space(), point, rng)
        assert contains(space(), child)
        changed = [name for name in point if child[name] != point[name]]
        assert len(changed) <= 1  # one parameter drawn again (perhaps to the same value)
        point = child


def test_the_same_seed_draws_the_same() -> None:
    assert sample(space(), random.Random(7)) == sample(space(), random.Random(7))
    assert sample(space(), random.Random(7)) != sample(space(), random.Random(8))


def test_a_mutation_leaves_its_parent_alone() -> None:
    rng = random.Random(3)
    parent = sample(space(), rng)
    kept = {**parent, "layers": [dict(item) for item in parent["layers"]]}
    for _ in range(20):
        mutate(space(), parent, rng)
    assert parent == kept


def test_the_grid_is_every_combination_each_point_computed_from_its_number() -> None:
    grid = Space.model_validate(
        {
            "params": {
                "lr": {"type": "log_uniform", "low": 1e-3, "high": 1e-1},
                "units": {"type": "int", "low": 1, "high": 2},
                "act": {"type": "choice", "values": ["relu", "tanh"]},
            }
        }
    )
    assert grid_size(grid, 3) == 3 * 2 * 2
    points = [grid_point(grid, k, 3) for k in range(12)]
    assert len({tuple(sorted(p.items())) for p in points}) == 12
    assert all(contains(grid, p) for p in points)
    assert [p["lr"] for p in points[::4]] == pytest.approx([1e-3, 1e-2, 1e-1])
    assert points[0] == {"lr": 1e-3, "units": 1, "act": "relu"}
    assert points[1] == {"lr": 1e-3, "units": 1, "act": "tanh"}  # the last varies fastest
    with pytest.raises(IndexError):
        grid_point(grid, 12, 3)
    assert grid_size(space(), 2) == 2 * 2 * 3 * 3 and math.isfinite(
        grid_point(space(), 35, 2)["lr"]
    )


WORDY: dict[str, Any] = {
    "params": {
        "big_real": {"type": "uniform", "low": -1e15, "high": 1e-300 + 1e15},
        "tiny_real": {"type": "log_uniform", "low": MIN_LOG_BOUND, "high": 10 * MIN_LOG_BOUND},
        "count": {"type": "int", "low": -(2**31 - 1), "high": 5},
        "word": {"type": "choice", "values": ['quote " and \\ and \n', "é" * 50, True, -1.5]},
        "layers": {
            "type": "repeat",
            "min": 1,
            "max": 16,
            "item": {
                "w": {"type": "int", "low": 1, "high": 4096},
                "act": {"type": "choice", "values": ["relu", "a\tb"]},
            },
        },
    }
}


@given(st.integers(0, 2**32))
def test_no_point_is_longer_than_the_bound_its_space_is_checked_with(seed: int) -> None:
    for document in (ARCHITECTURE, WORDY):
        space = Space.model_validate(document)
        point = sample(space, random.Random(seed))
        assert len(json.dumps(point, separators=(",", ":"))) <= max_point_chars(space)


def test_a_space_whose_points_a_learner_could_not_be_given_is_refused() -> None:
    wide = {f"p{k}": {"type": "choice", "values": ["x" * 200]} for k in range(12)}
    space = {"params": {"layers": {"type": "repeat", "min": 1, "max": 16, "item": wide}}}
    with pytest.raises(ValidationError, match="a point may take"):
        SearchSpec.model_validate({**SEARCH, "space": space})


@pytest.mark.parametrize("low", [5e-324, 1e-300, MIN_LOG_BOUND / 2])
def test_a_log_uniform_bound_below_the_floor_is_refused(low: float) -> None:
    """high / low spreads the grid: a tiny low made it infinite, and the first point NaN."""
    with pytest.raises(ValidationError, match="greater than or equal to"):
        Space.model_validate({"params": {"lr": {"type": "log_uniform", "low": low, "high": 1}}})


def test_a_search_stored_before_the_floors_reads_within_them() -> None:
    stored = {
        **SEARCH,
        "trial": {**SEARCH["trial"], "cpus": 5e-324},
        "space": {
            "params": {
                "lr": {"type": "log_uniform", "low": 5e-324, "high": 1},
                "layers": {
                    "type": "repeat",
                    "min": 1,
                    "max": 2,
                    "item": {"d": {"type": "log_uniform", "low": 1e-300, "high": 1e-3}},
                },
            }
        },
    }
    spec = SearchSpec.model_validate(stored_spec(stored))
    assert spec.trial.cpus == MIN_CPUS
    grid = [grid_point(spec.space, k, 3) for k in range(grid_size(spec.space, 3))]
    assert all(math.isfinite(point["lr"]) for point in grid)
    assert min(point["lr"] for point in grid) == MIN_LOG_BOUND
    assert max(point["lr"] for point in grid) == pytest.approx(1.0)


def test_a_search_submitted_before_the_socket_names_were_reserved_reads_without_them() -> None:
    """SearchSubmitted version 3 allowed the trial's `GLOO_SOCKET_IFNAME`: its trials run
    with the agent's (the job's own interface)."""
    env = {"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth0"}
    data = {
        "at": "2026-01-01T00:00:00Z",
        "search_id": "00000000-0000-0000-0000-000000000007",
        "tenant": "acme",
        "spec": {**SEARCH, "trial": {**SEARCH["trial"], "env": env}},
    }
    decoded = EVENT_REGISTRY.decode("SearchSubmitted", 3, json.dumps(data))
    assert isinstance(decoded, SearchSubmitted)
    assert decoded.spec.trial.env == {"NCCL_DEBUG": "INFO"}
