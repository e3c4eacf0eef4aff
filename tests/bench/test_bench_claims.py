"""`trainyard bench claims`, its queue parts briefly: eight agents claim concurrently from a deep
queue with the queue's projections in their own process, and no job or GPU is claimed twice;
and both queues of the comparison take and finish every job (its figures are for `bench/`,
not for this test; the comparison needs its peer, procrastinate, and skips without it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.cli import bench


def test_agents_claim_a_deep_queue_and_never_twice(pg_server: str, tmp_path: Path) -> None:
    result = bench(pg_server, tmp_path, "claims", "--seconds", "1", "--only", "claims")
    assert result["claims"] > 0 and result["claims_per_s"] > 0
    assert result["double_claims"] == 0
    assert "jobs_per_s" not in result  # the other parts did not run


def test_the_comparison_takes_and_finishes_every_job_on_both_sides(
    pg_server: str, tmp_path: Path
) -> None:
    pytest.importorskip("procrastinate")
    # Each side checks that every job it enqueued was taken and finished.
    result = bench(pg_server, tmp_path, "claims", "--only", "peer")
    assert result["jobs_per_s"] > 0 and result["peer_jobs_per_s"] > 0
    ratio = result["jobs_per_s"] / result["peer_jobs_per_s"]
    assert abs(result["ratio_vs_peer"] - ratio) < 0.01
