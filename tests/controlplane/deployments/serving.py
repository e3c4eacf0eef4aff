"""A serving cluster for tests: the control plane's HTTP app (with its lifecycle manager) on the
test's database, a real agent (process runtime) that shares its artifact folder, and helpers
to publish a model and deploy it."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web import BaseRunner

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.http.app import create_app
from node_agent.agent import AgentConfig
from tests.cluster import RunningAgent, agent_config
from tests.controlplane.models.samples import DOCUMENT
from tests.polling import eventually
from tests.tenancy import auth

Client = TestClient[Any, Any]


@asynccontextmanager
async def serving_cluster(
    db_url: str,
    tmp_path: Path,
    *,
    agents: int = 1,
    configs: Sequence[AgentConfig] = (),
    as_deployed: bool = False,
) -> AsyncIterator[tuple[Client, list[RunningAgent]]]:
    """The app and `agents` process-runtime agents (or agents of `configs`), all sharing the
    artifact folder `tmp_path/artifacts`; `as_deployed`: the app's handlers are not cancelled
    when their client goes away, as under a real server (aiohttp's test server cancels them)."""
    artifacts = tmp_path / "artifacts"
    app = create_app(db_url, poll_interval=0.2, artifacts=FileArtifactStore(artifacts))
    chosen = list(configs) or [agent_config(tmp_path, f"n{n + 1}") for n in range(agents)]
    server = DeployedServer(app) if as_deployed else TestServer(app)
    async with TestClient(server) as client:
        running = []
        try:
            for config in chosen:
                config = dataclasses.replace(config, artifacts_dir=artifacts)
                running.append(await RunningAgent(db_url, config, fake_gpus=0).started())
            yield client, running
        finally:
            for agent in running:
                await agent.finish()


class DeployedServer(TestServer):
    """The app served as the control plane serves it (controlplane/server.py's runner: no
    handler cancellation)."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return await super()._make_runner(**{**kwargs, "handler_cancellation": False})


def metadata(entry_point: str) -> dict[str, Any]:
    doc = {k: v for k, v in copy.deepcopy(DOCUMENT).items() if k != "provenance"}
    doc["servable"] = {
        "entry_point": entry_point,
        "input": {"type": "list"},
        "output": {"type": "list"},
    }
    return doc


async def publish(
    client: Client,
    token: str,
    name: str,
    artifact: bytes,
    entry_point: str,
    *,
    document: dict[str, Any] | None = None,
) -> None:
    form = aiohttp.MultipartWriter("form-data")
    part = form.append_json({"metadata": document or metadata(entry_point)})
    part.set_content_disposition("form-data", name="publication")
    part = form.append(artifact)
    part.set_content_disposition("form-data", name="artifact", filename="model.zip")
    response = await client.post(f"/v1/models/{name}/versions", data=form, headers=auth(token))
    assert response.status == 201, await response.text()


async def deploy(client: Client, token: str, **request: Any) -> dict[str, Any]:
    response = await client.post("/v1/deployments", json=request, headers=auth(token))
    assert response.status == 201, await response.text()
    view: dict[str, Any] = await response.json()
    return view


async def until_serving(client: Client, token: str, name: str, replicas: int) -> dict[str, Any]:
    """The deployment once `replicas` of its replica jobs are PROCESSING."""
    view: dict[str, Any] = {}

    async def ready() -> bool:
        nonlocal view
        response = await client.get(f"/v1/deployments/{name}", headers=auth(token))
        view = await response.json()
        states = [r["state"] for r in view["replica_jobs"]]
        return states.count("PROCESSING") == replicas

    await eventually(ready, seconds=60)
    return view


async def predict(
    client: Client, token: str, name: str, inputs: list[Any], **options: Any
) -> tuple[int, dict[str, Any]]:
    response = await client.post(
        f"/v1/deployments/{name}/predict", json={"inputs": inputs, **options}, headers=auth(token)
    )
    body: dict[str, Any] = await response.json()
    return response.status, body
