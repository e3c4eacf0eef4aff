"""End to end on a real engine: the control plane from the project's own image (run with
testcontainers) against the test's Postgres, a node agent with the Docker runtime, and a job
submitted over HTTP that runs in a learner container to COMPLETED, its logs read back over
HTTP."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import aiohttp
import pytest
from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from harness.served import free_port
from node_agent.images import LEARNER_IMAGE, PROJECT_IMAGE
from tests.cluster import Plane, RunningAgent
from tests.docker_engine import Engine, containers_of, docker_agent_config, require_engine

require_engine()  # or the whole module skips (on CI: fails)
pytestmark = pytest.mark.docker

SOCKET_DIR = "/run/postgresql"
"""Where the control plane's container finds a Postgres that listens on a Unix socket only
(as the embedded one does): the socket file itself is mounted there."""
START_S = 60


@dataclass(frozen=True, slots=True)
class Served:
    url: str
    admin_token: str


def in_container(db_url: str) -> tuple[str, dict[str, str]]:
    """The database URL as the container reaches it, and the mounts that needs (host path to
    container path). The container shares the host's network, so a TCP address works as is;
    a Unix socket is mounted into it."""
    parts = urlsplit(db_url)
    query = dict(parse_qsl(parts.query))
    socket_dir = query.get("host", "")
    if not socket_dir.startswith("/"):
        return db_url, {}
    name = f".s.PGSQL.{parts.port or 5432}"
    query["host"] = SOCKET_DIR
    url = parts._replace(query=urlencode(query)).geturl()
    return url, {str(Path(socket_dir) / name): f"{SOCKET_DIR}/{name}"}


@pytest.fixture
def control_plane(db_url: str, docker_engine: Engine) -> Iterator[Served]:
    # The reaper container testcontainers starts by default would have to be pulled (there is
    # no registry); the fixture removes its container itself.
    testcontainers_config.ryuk_disabled = True
    url, mounts = in_container(db_url)
    port = free_port()
    container = (
        DockerContainer(PROJECT_IMAGE)
        .with_env("TRAINYARD_DATABASE_URL", url)
        .with_command(["serve", "--host", "127.0.0.1", "--port", str(port)])
        .with_kwargs(network_mode="host")
        .waiting_for(
            LogMessageWaitStrategy("control plane on http://").with_startup_timeout(START_S)
        )
    )
    for host_path, container_path in mounts.items():
        container.with_volume_mapping(host_path, container_path, mode="rw")
    container.start()
    try:
        out, _ = container.get_logs()
        path = re.search(r"admin token issued, in (\S+) \(mode 0600\)", out.decode())
        assert path is not None, out.decode()
        # The token is in its file only, not in the container's logs.
        code, token = container.exec(["cat", path.group(1)])
        assert code == 0, token
        assert token.decode().strip() not in out.decode()
        yield Served(f"http://127.0.0.1:{port}", token.decode().strip())
    finally:
        container.stop()


async def test_a_job_runs_through_the_served_image_and_a_docker_agent_with_its_logs(
    plane: Plane,
    control_plane: Served,
    docker_engine: Engine,
    docker_node: str,
    tmp_path: Path,
) -> None:
    config = docker_agent_config(tmp_path, docker_engine, name=docker_node)
    agent = await RunningAgent(plane.url, config, fake_gpus=1).started()
    try:
        logs = await run_job(control_plane)
    finally:
        await agent.finish()
    assert "[attempt 1 learner 0 stdout] sum 45" in logs
    assert "[attempt 1 learner 0 stdout] done" in logs
    assert containers_of(docker_node) == []


async def run_job(served: Served) -> list[str]:
    """Submit a job as the admin for tenant acme, wait until it ends COMPLETED; its logs."""
    manifest = {
        "name": "end-to-end",
        "image": LEARNER_IMAGE,
        "command": [
            "python3",
            "-c",
            "import torch\nprint('sum', int(torch.arange(10).sum()))\nprint('done')",
        ],
        "gpus_per_learner": 1,
    }
    headers = {"Authorization": f"Bearer {served.admin_token}"}
    async with aiohttp.ClientSession(served.url, headers=headers) as session:
        async with session.post("/v1/jobs", params={"tenant": "acme"}, json=manifest) as response:
            assert response.status == 201, await response.text()
            job_id = (await response.json())["id"]
        async with asyncio.timeout(60):
            while True:
                async with session.get(f"/v1/jobs/{job_id}") as response:
                    job = await response.json()
                if job["state"] in ("COMPLETED", "FAILED", "CANCELLED"):
                    break
                await asyncio.sleep(0.2)
        assert job["state"] == "COMPLETED", job
        async with session.get(f"/v1/jobs/{job_id}/logs") as response:
            return (await response.text()).splitlines()
