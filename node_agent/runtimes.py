"""Which learner runtime an agent uses, and opening it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiodocker

from controlplane.agent_port.vocabulary import ImageAllowlist
from node_agent.docker_runtime import ENGINE_ERRORS, DockerRuntime
from node_agent.packages import Packages
from node_agent.process_runtime import ProcessRuntime
from node_agent.runtime import LearnerRuntime
from node_agent.sandbox import Sandbox
from node_agent.servable_images import ServableImages
from node_agent.warm import WarmSettings

RUNTIMES = ("process", "docker")
PACKAGES_DIR = "packages"
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
    warm: WarmSettings | None = None,
) -> AsyncIterator[LearnerRuntime]:
    """The runtime called `name`, for the agent working in `work_dir`, for as long as the block
    runs; `request_gpus` and `images`: see DockerRuntime (a process runs no image);
    `packages`: where models' requirements are fetched, for replicas' images (or read, by
    replicas that are processes); `warm`: what the process runtime's warm sandboxes run. An
    agent that is root and has no sandbox for processes refuses to start (SandboxMissing,
    naming what is missing): also when it chose processes because no Docker engine answered."""
    if name == "process":
        sandbox = None
        if os.geteuid() == 0:
            # Its replicas read their models' requirements there (`service.run_agent` gives
            # its Packages that folder): made now, so that a replica started before the first
            # install sees them.
            readable = [] if packages is None else [work_dir / PACKAGES_DIR]
            for folder in readable:
                folder.mkdir(parents=True, exist_ok=True)
            sandbox = Sandbox.open(readable=readable)
        yield ProcessRuntime(work_dir, sandbox, warm)
        return
    async with aiodocker.Docker() as docker:
        servables = None if packages is None else ServableImages(docker, packages)
        yield DockerRuntime(docker, request_gpus=request_gpus, images=images, servables=servables)
