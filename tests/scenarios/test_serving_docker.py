"""A deployment's replica in a learner container (the Docker runtime, no network, its own
user): the agent reaches it over the socket in its mounted folder, delivers the model and
feeds it; exact results come back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.controlplane.deployments.serving import (
    deploy,
    metadata,
    predict,
    publish,
    serving_cluster,
    until_serving,
)
from tests.controlplane.deployments.test_serving_requirements import build_wheel
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


USES_PACKAGE = b"""import tinytrainyardpkg

def predict(batch):
    return [tinytrainyardpkg.triple(x) for x in batch]
"""


async def test_a_models_requirements_are_built_into_its_replicas_image(
    db_url: str,
    tmp_path: Path,
    tokens: Tokens,
    docker_engine: Engine,
    docker_node: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels)
    # Fetched by the node's pip, as its settings say (here: a local folder, no index).
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    doc = metadata("uses:predict")
    doc["servable"]["requirements"] = ["tinytrainyardpkg==1.0"]
    config = docker_agent_config(tmp_path, docker_engine, name=docker_node)
    async with serving_cluster(db_url, tmp_path, configs=[config]) as (client, _):
        await publish(client, tokens.acme, "uses", USES_PACKAGE, "uses:predict", document=doc)
        await deploy(client, tokens.acme, name="uses", model="uses")
        await until_serving(client, tokens.acme, "uses", 1)
        status, task = await predict(client, tokens.acme, "uses", [1, 2])
        assert (status, task.get("outputs")) == (200, [3, 6]), task
    listed = await asyncio.create_subprocess_exec(
        "docker", "images", "--quiet", "trainyard-servable", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await listed.communicate()
    assert out.split(), "the servable image was built, and kept for the next replica"
