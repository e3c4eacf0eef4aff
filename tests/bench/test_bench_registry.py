"""`trainyard bench registry`, small: every version is published, and every search's answer is
checked against the reference evaluation inside the benchmark (it fails otherwise); MLflow's
half runs only where the `bench` extra is installed."""

from __future__ import annotations

from pathlib import Path

from tests.bench.cli import bench


def test_the_registry_benchmark_publishes_and_searches(pg_server: str, tmp_path: Path) -> None:
    result = bench(
        pg_server, tmp_path, "registry", "--models", "30", "--versions", "3", "--repeats", "2"
    )
    assert result["versions"] == 90
    assert result["publish_per_s"] > 0
    assert 0 < result["search_p50_ms"] <= result["search_p99_ms"]
    assert len(result["per_case"]) == 12
