"""`trainyard bench simulate`, briefly: a few jobs recorded on one real agent with fake GPUs,
then replayed (its figures are for `bench/`, not for this test: a run this short starts with
every job queued at once, which the replay takes first come, first served)."""

from __future__ import annotations

from pathlib import Path

from tests.bench.cli import bench


def test_a_recorded_run_is_replayed_and_compared(pg_server: str, tmp_path: Path) -> None:
    options = ("--jobs", "24", "--agents", "1", "--gpus", "4")
    options += ("--claim-queue", "200", "--claim-seconds", "0.5")
    result = bench(pg_server, tmp_path, "simulate", *options)
    assert result["jobs"] == 24
    assert result["recorded_makespan_s"] > 0 and result["speedup_vs_realtime"] > 0
    assert 0 <= result["start_order_agreement"] <= 1
    assert result["start_time_error"] >= 0
    assert result["deterministic"] == 1
    assert set(result["policies"]) == {"current", "fair_share", "priority", "fifo"}
    # Jobs' reasons were seen come and go (not every job's: one claimed within a recorder's
    # round was never judged; coverage is sampled only past a thousand queued jobs), and the
    # claims were timed both ways.
    assert 0 < result["reason_changes_timed"] <= 2 * 24
    assert result["reason_latency_p99_ms"] is not None and result["coverage_samples"] == 0
    assert result["claims_per_s_with_reasons"] > 0 and result["claims_per_s_without_reasons"] > 0
    assert len(result["claim_slowdown_pairs"]) == 4
