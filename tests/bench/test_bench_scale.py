"""`trainyard bench scale` end to end, small: it fills the smallest history once, keeps it for
the next run, drives the real claim, heartbeat, report and API paths with simulated agents, and
draws its plots (its figures are for `bench/`, not for this test)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from controlplane.database import connect
from tests.bench.cli import bench


def test_the_scale_benchmark_keeps_its_history_and_measures_every_path(
    pg_server: str, tmp_path: Path
) -> None:
    prefix = f"trainyard_scale_test_{os.getpid()}"
    # More GPUs (320) than the queue's jobs need: nodes with a GPU free claim at every poll,
    # so that the timed window holds claims (learners run for half a minute at least).
    options = ["--sizes", "10k", "--nodes", "40", "--queued", "60", "--seconds", "3"]
    options += ["--subscribers", "20", "--out", str(tmp_path / "plots")]
    # The fleet through pgBouncer has tests of its own (tests/ha/test_pooler.py).
    options += ["--database-prefix", prefix, "--no-pooler"]
    try:
        first = bench(pg_server, tmp_path, "scale", *options)
        second = bench(pg_server, tmp_path, "scale", *options)
    finally:
        asyncio.run(_drop(pg_server, f"{prefix}_10k"))
    assert first["nodes"] == 40 and first["queued_jobs"] == 60
    filled, kept = first["by_events"]["10k"], second["by_events"]["10k"]
    assert first["events"] >= 10_000
    assert filled["fill_s"] > 0 and kept["fill_s"] == 0  # the second run refilled nothing
    # The second run's history holds the first's, and what the first run itself appended.
    assert second["events"] > first["events"]
    assert filled["sse_missing"] == 0
    for key in ("claim_p99_ms", "submit_p99_ms", "status_p99_ms", "list_p99_ms", "sse_p99_ms"):
        assert first[key] > 0, key
    assert first["restart_ready_s"] > 0 and filled["reconcile_s"] > 0
    assert filled["rebuild_s"] > 0 and filled["mb_per_million_events"] > 0
    assert first["growth"] == 1.0  # one size: its own reference
    assert first["pooler"] == {"skipped": "--no-pooler"}
    assert first["plots"] and all(Path(plot).stat().st_size > 0 for plot in first["plots"])


async def _drop(server: str, name: str) -> None:
    admin = await connect(server, role=None)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
