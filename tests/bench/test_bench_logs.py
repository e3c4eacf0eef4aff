"""`trainyard bench logs` end to end, small: it fills its kept log once (a second run refills
nothing), searches it (also while lines wait for the indexer), and measures ingestion with and
without the search on the writer's path, the indexer, and the writer and the indexers at once
(their committed lines removed afterwards); the JSON's shape (its figures are for
docs/log-search.md, not for this test)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from controlplane.database import connect
from tests.bench.cli import bench

PATTERNS = {"rare_substring", "common_substring", "rare_ignore_case", "absent_substring", "regex"}


def test_the_logs_benchmark_keeps_its_log_and_reports_search_and_ingestion(
    pg_server: str, tmp_path: Path
) -> None:
    prefix = f"trainyard_logs_test_{os.getpid()}"
    options = ["--size", "20000", "--searches", "3", "--seconds", "0.5"]
    options += ["--database-prefix", prefix]
    try:
        first = bench(pg_server, tmp_path, "logs", *options)
        second = bench(pg_server, tmp_path, "logs", *options)
    finally:
        asyncio.run(_drop(pg_server, f"{prefix}_20000"))
    assert first["lines"] == second["lines"] == 20_000  # ingestion's lines were rolled back
    assert first["fill_s"] > 0 and second["fill_s"] == 0
    assert 0 < first["tenant_lines"] < first["lines"] and first["jobs"] == 4
    assert isinstance(first["trigram_index"], bool)
    assert set(first["search"]) == PATTERNS
    for figures in first["search"].values():
        assert 0 < figures["p50_ms"] <= figures["p95_ms"]
    assert first["search"]["common_substring"]["lines"] == first["search_page"]
    assert first["search"]["absent_substring"]["lines"] == 0
    assert first["ingest_lines_per_s_with_index"] > 0
    assert first["ingest_lines_per_s_without_index"] > 0
    assert first["ingest_ratio"] > 0
    assert isinstance(first["meets_search_target"], bool)
    assert isinstance(first["meets_ingest_target"], bool)
    # Rates only: which is faster is the benchmark's figure, not this test's.
    assert first["ingest_and_index_lines_per_s"] > 0 and first["index_lines_per_s"] > 0
    # The writer and 1, then 2, of the control plane's indexers at once, flat out and paced.
    runs = first["sustained"]
    assert [(r["indexers"], r["writer"]) for r in runs] == [
        (1, "flat_out"),
        (1, "at_target"),
        (2, "flat_out"),
        (2, "at_target"),
    ]
    for run in runs:
        # Half a second is about one batch of the indexers: they may not have committed one.
        assert run["stored_lines_per_s"] > 0 and run["indexed_lines_per_s"] >= 0
        assert run["queued_lines_end"] >= 0 and run["drain_s"] >= 0
        assert isinstance(run["keeps_up"], bool)
        assert run["stored_ratio_vs_without_index"] > 0
    assert isinstance(first["sustained_meets_ingest_target"], bool)
    queued = first["queued_search"]
    assert queued["queued_lines"] == 50_000 and queued["index_s"] > 0
    assert queued["search"]["common_substring"]["lines"] == first["search_page"]
    # The queued lines hold no rare term: they change no answer, only its time.
    rare = queued["search"]["rare_substring"]["lines"]
    assert rare == first["search"]["rare_substring"]["lines"]


async def _drop(server: str, name: str) -> None:
    admin = await connect(server, role=None)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
