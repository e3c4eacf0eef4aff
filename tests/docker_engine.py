"""A real Docker engine for the tests that need one. On CI (where CI is set) they must run:
`./dev test` installs and starts the engine and builds the images, and anything missing is a
failure. Elsewhere they skip, with one line saying why."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

import aiodocker
import pytest
from aiodocker.exceptions import DockerError

from node_agent.agent import AgentConfig
from node_agent.cli import LAUNCHERS
from node_agent.containers import GPU_DRIVER, LearnerLabels
from node_agent.images import LEARNER_IMAGE, PROJECT_IMAGE
from node_agent.runtimes import docker_answers
from tests.cluster import agent_config


@dataclass(frozen=True, slots=True)
class Engine:
    gpu_driver: bool
    """Whether the engine can start containers that request GPUs (a real NVIDIA toolkit, or
    the stand-in images/ci/nvidia-container-runtime-hook that `./dev test` gives it)."""


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; on CI the Docker tests must run (./dev test sets Docker up)")
    pytest.skip(f"{reason} (./dev test as root sets Docker up)", allow_module_level=True)


def require_engine() -> Engine:
    """The engine, with the project's images. Called at the top of each Docker test module:
    without them the module skips (every module on one line, this one's) or, on CI, fails."""
    found = _engine()
    if isinstance(found, str):
        unavailable(found)
    return found


@functools.cache
def _engine() -> Engine | str:
    """The engine, or why there is none; looked for once per test session."""
    if not asyncio.run(docker_answers()):
        return "no Docker engine answers"
    for image in (LEARNER_IMAGE, PROJECT_IMAGE):
        found = subprocess.run(["docker", "image", "inspect", image], capture_output=True)
        if found.returncode != 0:
            return f"no {image} image (images/build.sh builds it)"
    return Engine(gpu_driver=asyncio.run(_has_gpu_driver()))


async def _has_gpu_driver() -> bool:
    async with aiodocker.Docker() as docker:
        container = await docker.containers.create(
            {
                "Image": LEARNER_IMAGE,
                "Cmd": ["true"],
                "HostConfig": {
                    "DeviceRequests": [
                        {
                            "Driver": GPU_DRIVER,
                            "DeviceIDs": ["GPU-probe"],
                            "Capabilities": [["gpu"]],
                        }
                    ]
                },
            }
        )
        try:
            await container.start()
            return True
        except DockerError as exc:
            if "could not select device driver" in exc.message:
                return False
            raise
        finally:
            await container.delete(force=True)


def require_gpu_driver(engine: Engine) -> None:
    if not engine.gpu_driver:
        unavailable(f"the Docker engine has no {GPU_DRIVER!r} device driver for GPU requests")


def node_name() -> str:
    """A node name of the test's own: engineers and CI runs may share one engine, and the
    agent finds its containers by node."""
    return f"test-{uuid.uuid4().hex[:8]}"


def docker_agent_config(tmp_path: Path, engine: Engine, *, name: str) -> AgentConfig:
    return replace(
        agent_config(tmp_path, name=name),
        # One more than the machine has: the engine refuses a container that asks for them,
        # one of the bad inputs a job must fail on.
        cpus=float(os.cpu_count() or 1) + 1,
        runtime="docker",
        launcher=LAUNCHERS["docker"],
        request_gpus=engine.gpu_driver,
    )


def containers_of(node: str) -> list[str]:
    """IDs of the node's learner containers, running or not, as the CLI sees them."""
    listed = subprocess.run(
        ["docker", "ps", "--all", "--quiet", "--filter", f"label={LearnerLabels.NODE}={node}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


async def kill_from_outside(container: str) -> None:
    """`docker kill`, as an operator (or anything else on the node) would."""
    process = await asyncio.create_subprocess_exec(
        "docker", "kill", container, stdout=asyncio.subprocess.DEVNULL
    )
    assert await process.wait() == 0


def remove_containers_of(node: str) -> None:
    ids = containers_of(node)
    if ids:
        subprocess.run(["docker", "rm", "--force", *ids], capture_output=True, check=True)
