"""Which runtime `trainyard agent` picks when not told: docker when an engine answers (that
half is in tests/node_agent/test_docker_runtime.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli.main import parser
from controlplane.settings import Settings
from node_agent.cli import NoEngine, choose_runtime, cmd_agent, runs_tenants_code
from node_agent.users import UidRange


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


async def test_asked_for_docker_without_an_engine_the_agent_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Never a silent fall back to processes, which isolate tenants' code less.
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(NoEngine, match="--runtime docker, but no Docker engine answers"):
        await choose_runtime("docker")
    args = parser().parse_args(["agent", "--runtime", "docker", "--fake-gpus", "1"])
    assert await cmd_agent(args, Settings(tmp_path, None)) == 1
    assert os.listdir(tmp_path) == []  # nothing started, nothing written


def test_the_start_line_says_who_runs_tenants_code() -> None:
    uids = UidRange(200000, 10)
    as_root = runs_tenants_code("process", root=True, uids=uids)
    assert as_root == (
        "tenants' code runs as processes on this machine, each job as its own uid (200000-200009)"
    )
    assert "AS THE AGENT'S OWN USER" in runs_tenants_code("docker", root=False, uids=uids)
