"""`trainyard bench serving`, small and without its peers: a served control plane and a real
agent serve the MLP and the no-op model, and asynchronous tasks survive a replica, the agent
and the control plane being killed with SIGKILL: none lost, none run twice, every output the
MLP's own (the benchmark checks each against the model computed here). Its figures are for
`bench/`, not for this test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.cli import bench

pytestmark = pytest.mark.processes


def test_the_serving_benchmark_serves_and_loses_no_task_to_kills(
    pg_server: str, tmp_path: Path
) -> None:
    # The replicas import it to run the MLP, and the benchmark to check their outputs.
    pytest.importorskip("torch")
    options = ["--duration", "1", "--tasks", "40", "--no-peers"]
    result = bench(pg_server, tmp_path, "serving", *options)
    for concurrency in ("1", "8", "32", "256"):
        figures = result["concurrency"][concurrency]
        assert figures["trainyard"]["throughput_rps"] > 0
        assert figures["trainyard"]["errors"] == 0
        assert 1 <= figures["trainyard"]["mean_batch_items"] <= 8
        assert figures["ray_serve"] is None and figures["bentoml"] is None
        assert result["p99_ms"][concurrency]["trainyard"] == figures["trainyard"]["p99_ms"]
    assert result["throughput_ratio_vs_ray_serve"] is None
    assert result["throughput_ratio_vs_bentoml"] is None
    assert result["tail_growth"] > 0
    assert result["tail_growth_peers"] == {"ray_serve": None, "bentoml": None}
    assert 0 < result["noop_p50_ms"] <= result["noop_p99_ms"]
    assert result["memo_hit_p99_ms"] > 0
    assert result["batching_gain"] > 0
    assert result["no_batching"]["mean_batch_items"] == 1
    assert result["async"]["tasks"] == 40
    assert result["async_lost"] == 0
    assert result["async_duplicated"] == 0
    assert result["async_failed"] == 0
    assert result["async_wrong_outputs"] == 0
    assert result["async_retried"] <= result["async"]["tasks"]
