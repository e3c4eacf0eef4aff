"""`trainyard bench api` end to end, briefly: the benchmark runs against a served control plane
and reports what it measured (its figures are for `bench/`, not for this test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.cli import bench


def test_the_api_benchmark_runs_and_misses_no_delivery(pg_server: str, tmp_path: Path) -> None:
    options = ["--seconds", "1", "--rate", "20", "--subscribers", "5", "--jobs", "2"]
    result = bench(pg_server, tmp_path, "api", *options, "--event-rate", "10")
    assert result["submit_per_s"] > 0 and result["submit_p99_ms"] > 0
    # The floor's submits were answered (it raises otherwise), and the ratio is theirs (taken
    # before the figures were rounded to hundredths of a millisecond).
    floor_p99 = result["submit_floor_p99_ms"]
    assert 0 < result["submit_floor_p50_ms"] <= floor_p99
    ratio = result["submit_p99_ms"] / floor_p99
    assert result["submit_p99_vs_floor"] == pytest.approx(ratio, abs=0.02)
    assert result["sse_deliveries"] > 0 and result["sse_deliveries_missing"] == 0
