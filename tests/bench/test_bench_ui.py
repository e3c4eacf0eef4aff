"""`trainyard bench ui` end to end, briefly: the benchmark fills a scratch database, reads the
dashboard's data through its session, and follows a job's logs across dropped connections
without missing or doubling a line (its figures are for `bench/`, not for this test)."""

from __future__ import annotations

from pathlib import Path

from tests.bench.cli import bench


def test_the_ui_benchmark_runs_and_loses_no_line_across_reconnects(
    pg_server: str, tmp_path: Path
) -> None:
    options = ["--jobs", "300", "--requests", "5", "--reconnects", "2"]
    result = bench(pg_server, tmp_path, "ui", *options)
    assert result["jobs"] == 300
    assert result["jobs_page_p95_ms"] > 0 and result["job_page_p95_ms"] > 0
    assert 0 < result["first_load_kb"] <= result["targets"]["first_load_kb"]
    assert result["sse_reconnect_gap"] == 0
