"""`trainyard bench search`, its cluster parts briefly: a search of a few 1 s trials on two
agent slots, then one with the control plane killed once (kill -9) and restarted, which loses
and duplicates no trial as the event log counts them (its figures are for `bench/`, not for
this test; the in-process digits search is left out)."""

from __future__ import annotations

from pathlib import Path

from bench.search import IN_JOB_STAGES
from tests.bench.cli import bench


def test_a_search_runs_its_trials_and_a_kill_loses_or_duplicates_none(
    pg_server: str, tmp_path: Path
) -> None:
    options = ("--trials", "4", "--kill-trials", "6", "--kills", "1", "--seed", "3")
    result = bench(pg_server, tmp_path, "search", *options, "--skip-quality")
    assert result["trials"] == 4 and result["slots"] == 2
    assert result["ideal_s"] == 2.0
    assert 0 < result["trial_efficiency"] <= 1
    # Two trials start with the submission; each of the other two follows a trial's end.
    assert result["next_trial_ms"]["samples"] == 2
    assert result["next_trial_p99_ms"] == result["next_trial_ms"]["p99"] > 0
    assert set(result["per_trial_overhead_s"]) == {
        "in_job",
        "deploying_to_processing",
        "processing_to_completed_less_sleep",
        "between_trials",
    }
    assert set(result["next_trial_stages_ms"]) == {"driver", "submit", "claim"}
    # The slowest gap's stages are its own: each a time between two of its events.
    slowest = result["next_trial_ms"]["max_stages"]
    assert set(slowest) == {"driver", "submit", "claim"} and min(slowest.values()) > 0, slowest
    # Every trial went through each phase: each stage of its time in its job is measured.
    stages = result["in_job_stages_ms"]
    assert list(stages) == list(IN_JOB_STAGES) and None not in stages.values(), stages
    assert result["kills_made"] == 1 and len(result["kill_moments"]) == 1
    assert result["lost_trials"] == 0, result["lost"]
    assert result["lost"]["search_state"] == "completed"
    assert result["duplicate_trials"] == 0, result["duplicates"]
    assert result["failed_trials"] == 0
    assert "asha_compute_ratio" not in result
    assert set(result["targets"]) >= {
        "trial_efficiency",
        "next_trial_p99_ms",
        "lost_trials",
        "duplicate_trials",
    }
