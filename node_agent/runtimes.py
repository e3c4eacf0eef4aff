"""Which learner runtime an agent uses, and opening it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiodocker

from controlplane.jobs.images import ImageAllowlist
from node_agent.docker_runtime import ENGINE_ERRORS, DockerRuntime
from node_agent.packages import Packages
from node_agent.process_runtime import ProcessRuntime
from node_agent.runtime import LearnerRuntime
from node_agent.servable_images import ServableImages

RUNTIMES = ("process", "docker")
ANSWER_S = 3.0
"""How long a Docker engine may take to answer before the agent does without it."""


async def docker_answers() -> bool:
    """Whether a Docker engine answers at the usual places (DOCKER_HOST, the docker context,
    /var/run/docker.sock)."""
    try:
        docker = aiodocker.Docker()
    except (AssertionError, ValueError):
        # What aiodocker raises when it finds no engine address at all.
        return False
    try:
        async with asyncio.timeout(ANSWER_S):
            await docker.version()
        return True
    except (*ENGINE_ERRORS, TimeoutError):
        return False
    finally:
        await docker.close()


@asynccontextmanager
async def open_runtime(
    name: str,
    *,
    work_dir: Path,
    request_gpus: bool,
    images: ImageAllowlist,
    packages: Packages | None = None,
) -> AsyncIterator[LearnerRuntime]:
    """The runtime called `name`, for the agent working in `work_dir`, for as long as the block
    runs; `request_gpus` and `images`: see DockerRuntime (a process runs no image);
    `packages`: where models' requirements are fetched, for replicas' images."""
    if name == "process":
        yield ProcessRuntime(work_dir)
        return
    async with aiodocker.Docker() as docker:
        servables = None if packages is None else ServableImages(docker, packages)
        yield DockerRuntime(docker, request_gpus=request_gpus, images=images, servables=servables)
