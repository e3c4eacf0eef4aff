"""Which runtime `trainyard agent` picks when not told: docker when an engine answers (that
half is in tests/test_docker_runtime.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.cli import choose_runtime


async def test_without_an_engine_learners_run_as_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # no docker context to fall back on
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    runtime, why = await choose_runtime(None)
    assert (runtime, why) == (
        "process",
        "no Docker engine answers; learners run as child processes",
    )
