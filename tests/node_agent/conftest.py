"""Agents on the port's in-memory twin, for the tests of the agent's behaviour that need no
database (those of its SQL, and a few end to end, run on Postgres: `plane`, `agent`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.cluster import agent_config
from tests.node_agent.twin import Twin, TwinAgent


@pytest.fixture
def twin() -> Twin:
    return Twin()


@pytest.fixture
async def twin_agent(twin: Twin, tmp_path: Path) -> AsyncIterator[TwinAgent]:
    """A real agent on the twin, node n1 with two fake GPUs."""
    running = await TwinAgent(twin, agent_config(tmp_path), fake_gpus=2).started()
    yield running
    await running.finish()
