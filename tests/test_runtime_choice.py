"""Which runtime `trainyard agent` picks when not told: docker when an engine answers."""

from __future__ import annotations

import pytest

from node_agent.cli import choose_runtime
from tests.docker_engine import Engine


async def test_without_an_engine_learners_run_as_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    runtime, why = await choose_runtime(None)
    assert (runtime, why) == (
        "process",
        "no Docker engine answers; learners run as child processes",
    )


async def test_with_an_engine_learners_run_in_containers(docker_engine: Engine) -> None:
    assert (await choose_runtime(None))[0] == "docker"


async def test_the_runtime_asked_for_wins(docker_engine: Engine) -> None:
    assert await choose_runtime("process") == ("process", "--runtime")
