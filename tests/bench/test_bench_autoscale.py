"""`trainyard bench autoscale`: a served control plane and a real agent scale a deployment from
zero for one request, up under load, and back to zero, every request answered and every move an
event. Its figures are for `bench/`, not for this test."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.bench.cli import bench

pytestmark = pytest.mark.processes


def test_the_autoscale_benchmark_scales_from_zero_up_and_back(
    pg_server: str, tmp_path: Path
) -> None:
    result = bench(pg_server, tmp_path, "autoscale", "--clients", "2")
    assert result["cold_start_s"] > 0
    assert 0 < result["cold_start_autoscaled_s"] <= result["cold_start_s"]
    assert result["replicas_needed"] == 2
    assert result["replicas_serving"] == 2
    assert 0 < result["scale_up_s"] <= result["scale_up_full_s"]
    assert result["scale_to_zero_s"] >= result["settings"]["autoscaling"]["scale_down_delay_s"]
    assert result["failures"] == []
    assert result["answers"] > 0
    moves = result["moves"]
    assert (moves[0]["previous"], moves[0]["replicas"], moves[0]["waiting"]) == (0, 1, 1)
    assert max(move["replicas"] for move in moves) >= 2
    assert moves[-1]["replicas"] == 0
    for before, after in itertools.pairwise(moves):
        assert after["previous"] == before["replicas"]
