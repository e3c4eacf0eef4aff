"""What `trainyard bench contract` generates beyond the schema is what the server accepts: the
model queries the user guide's grammar allows, and valid cases repaired to keep the rules the
document states in words (bench/api_contract_formats.py, bench/api_contract_rules.py)."""

from __future__ import annotations

import copy
import math
from typing import Any

import asyncpg
import pytest
from hypothesis import given, settings

from bench import api_contract_rules
from bench.api_contract_formats import MODEL_QUERY, ORCID
from controlplane.inference.spec import MAX_ITEM_ELEMENTS, InferenceRequest
from controlplane.logs.search import MAX_PATTERN
from controlplane.models.metadata import Creator
from controlplane.models.query.query import parse
from controlplane.searches.spec import SearchSpec

TRIAL = {"name": "t", "image": "trainyard-learner", "command": ["python", "train.py"]}


@settings(max_examples=500)
@given(MODEL_QUERY)
def test_every_query_the_grammar_allows_parses(query: str) -> None:
    parse(query)


def search(space: dict[str, Any], searcher: dict[str, Any], budget_max: int = 10) -> dict[str, Any]:
    return {
        "name": "s",
        "trial": TRIAL,
        "space": {"params": space},
        "searcher": searcher,
        "metric": {"name": "loss", "mode": "min"},
        "budget": {"unit": "steps", "max": budget_max},
        "max_trials": 4,
    }


def test_a_search_s_ranges_and_searcher_are_repaired_into_one_the_server_accepts() -> None:
    body = search(
        {
            "a": {"type": "uniform", "low": 3.0, "high": 2.0},
            "b": {"type": "log_uniform", "low": 5.0, "high": 5.0},
            "c": {"type": "int", "low": 9, "high": -1},
            "d": {
                "type": "repeat",
                "min": 4,
                "max": 2,
                "item": {"e": {"type": "uniform", "low": 1.0, "high": 1.0}},
            },
        },
        {"name": "asha", "min_budget": 10},
        budget_max=10,
    )
    before = copy.deepcopy(body)
    api_contract_rules.search(body)
    spec = SearchSpec.model_validate(body)
    assert spec.searcher.min_budget < spec.budget.max  # type: ignore[union-attr]
    # The ranges keep their ends, in order.
    params = body["space"]["params"]
    assert (params["a"]["low"], params["a"]["high"]) == (2.0, 3.0)
    assert (params["c"]["low"], params["c"]["high"]) == (-1, 9)
    assert (params["d"]["min"], params["d"]["max"]) == (2, 4)
    assert before["space"]["params"].keys() == params.keys()


def test_an_evolution_sample_larger_than_its_population_is_swapped() -> None:
    body = search(
        {"a": {"type": "uniform", "low": 0.0, "high": 1.0}},
        {"name": "evolution", "population": 3, "sample": 9},
    )
    api_contract_rules.search(body)
    assert SearchSpec.model_validate(body).searcher.population == 9  # type: ignore[union-attr]


def test_a_generated_shape_is_cut_to_the_items_bound_and_queries_to_the_batches() -> None:
    generated = {
        "name": "i",
        "model": "m",
        "input": {"generate": {"shape": [360555, 7348, 2, 592110]}},
    }
    api_contract_rules.inference(generated)
    shape = InferenceRequest.model_validate(generated).input.generate.shape  # type: ignore[union-attr]
    assert 1 <= math.prod(shape) <= MAX_ITEM_ELEMENTS
    given_items = {
        "name": "i",
        "model": "m",
        "input": {"items": [1, 2, 3]},
        "batch_size": 2,
        "queries": 9,
    }
    api_contract_rules.inference(given_items)
    assert InferenceRequest.model_validate(given_items).queries == 2


@given(ORCID)
def test_every_orcid_generated_has_its_check_digit(orcid: str) -> None:
    assert Creator.model_validate({"name": "A", "orcid": orcid}).orcid == orcid


def test_a_pending_window_ending_before_it_starts_is_turned_around() -> None:
    query = {"since": "2026-11-29T10:00:00Z", "until": "2026-11-28t09:00:00z", "seconds": "1"}
    api_contract_rules.pending_window(query)
    assert (query["since"], query["until"]) == ("2026-11-28t09:00:00z", "2026-11-29T10:00:00Z")


def test_a_grid_too_large_is_replaced_whatever_json_number_its_points_are() -> None:
    params = {f"p{n}": {"type": "int", "low": 0.0, "high": 99.0} for n in range(6)}
    body = search(params, {"name": "grid", "points": 16.0})
    api_contract_rules.search(body)
    assert SearchSpec.model_validate(body).space.params.keys() == {"x"}


@pytest.mark.parametrize("text", ["a[b(c\\ù*", "^$.|?+{1}", "plain words", "ü[", "x" * 499 + "["])
async def test_a_log_search_pattern_made_a_regex_is_one_postgres_reads_matching_its_text(
    pool: asyncpg.Pool, text: str
) -> None:
    query = {"regex": "true", "pattern": text}
    api_contract_rules.log_search(query)
    assert len(query["pattern"]) <= MAX_PATTERN
    kept = text[: len(text) - (len(text) > 400)]  # the long one loses its last character
    assert await pool.fetchval("SELECT $1 ~ $2", kept, query["pattern"])


def test_an_upload_s_well_formed_sha256_is_left_out_and_a_malformed_one_kept() -> None:
    body: dict[str, Any] = {"publication": {"metadata": {}, "sha256": "0" * 64}}
    api_contract_rules.upload(body)
    assert "sha256" not in body["publication"]
    invalid: dict[str, Any] = {"publication": {"metadata": {}, "sha256": "XYZ"}}
    api_contract_rules.upload(invalid)
    assert invalid["publication"]["sha256"] == "XYZ"


def test_a_job_s_secrets_leave_env_their_names_and_fit_their_bound() -> None:
    body: dict[str, Any] = {
        "env": {"A": "1", "B": "2"},
        "secret_env": {"A": "s", **{f"K{n}": "v" * 2000 for n in range(40)}},
    }
    api_contract_rules.job(body)
    assert body["env"] == {"B": "2"}
    assert sum(len(f"{k}{v}") for k, v in body["secret_env"].items()) <= 64 * 1024
    assert "A" in body["secret_env"]
