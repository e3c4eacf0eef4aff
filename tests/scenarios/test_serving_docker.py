"""A deployment's replica in a learner container (the Docker runtime, no network, its own
user): the agent reaches it over the socket in its mounted folder, delivers the model and
feeds it; exact results come back."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.controlplane.deployments.serving import (
    deploy,
    predict,
    publish,
    serving_cluster,
    until_serving,
)
from tests.docker_engine import Engine, docker_agent_config, require_engine
from tests.tenancy import Tokens

require_engine()  # or the whole module skips (on CI: fails)
pytestmark = pytest.mark.docker

DOUBLE = b"def predict(batch):\n    return [x * 2 for x in batch]\n"


async def test_a_replica_in_a_container_serves_exact_results(
    db_url: str, tmp_path: Path, tokens: Tokens, docker_engine: Engine, docker_node: str
) -> None:
    config = docker_agent_config(tmp_path, docker_engine, name=docker_node)
    async with serving_cluster(db_url, tmp_path, configs=[config]) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await deploy(client, tokens.acme, name="dbl", model="double")
        await until_serving(client, tokens.acme, "dbl", 1)
        status, task = await predict(client, tokens.acme, "dbl", [1, 2.5, -3])
        assert (status, task["outputs"]) == (200, [2, 5.0, -6]), task
