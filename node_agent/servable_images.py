"""Images for deployments' replicas whose model lists requirements (the Docker runtime): the
learner image the deployment names, plus the requirements, built on the node (no registry),
once per image and set of requirements, and tagged by their hash.

The tenant's image runs nothing during the build (docs/servable-packages.md): the agent's own
pip installs the requirements on the node from its wheelhouse (`Packages.site`, the folder the
process runtime's replicas use too), and the build only copies that folder into the image: a
`FROM` and a `COPY`, no `RUN`, so neither the image's `python3` nor anything else in it is
started. The one way a `FROM` runs an image's code, its `ONBUILD` triggers, is refused."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import aiodocker

from node_agent.docker_runtime import ENGINE_ERRORS
from node_agent.packages import COMPLETE, IN_IMAGE, Packages, PackagesError
from node_agent.runtime import LearnerStartError

REPOSITORY = "trainyard-servable"
CONTEXT_FOLDER = "packages"
"""The installed requirements' folder in the build's context."""


def dockerfile(base: str) -> str:
    """A copy onto `base`, and nothing that runs (no `RUN`, no `USER`): the packages are root's
    and read-only to the replica, which runs as its job's user."""
    return f"FROM {base}\nCOPY {CONTEXT_FOLDER} {IN_IMAGE}\n"


def image_tag(base_id: str, requirements: Sequence[str]) -> str:
    # The recipe is part of the hash: an image an older recipe built is never taken for one of
    # this recipe's (an older one ran pip in the tenant's image).
    facts = json.dumps([dockerfile(base_id), sorted(requirements)])
    return f"{REPOSITORY}:{hashlib.sha256(facts.encode()).hexdigest()[:32]}"


class ServableImages:
    def __init__(self, docker: aiodocker.Docker, packages: Packages) -> None:
        self._docker = docker
        self._packages = packages

    async def image(self, base_id: str, requirements: Sequence[str]) -> str:
        """The ID of the image for `requirements` on the image `base_id` (built if missing);
        LearnerStartError saying why it could not be made."""
        tag = image_tag(base_id, requirements)
        found = await self._inspect(tag)
        if found is not None:
            return str(found["Id"])
        base = await self._inspect(base_id)
        if base is None:
            raise LearnerStartError(f"image {base_id} is not on this node")
        # Checked on the image's ID, which the build starts from: its triggers cannot change.
        triggers = (base.get("Config") or {}).get("OnBuild") or []
        if triggers:
            raise LearnerStartError(
                f"image {base_id} has ONBUILD triggers ({'; '.join(map(str, triggers))[:500]}), "
                "which a build from it would run: a replica whose model lists requirements "
                "needs an image without them"
            )
        try:
            site = await self._packages.site(requirements)
        except PackagesError as exc:
            message = f"the model's requirements could not be installed: {exc}"
            raise LearnerStartError(message) from exc
        # A file, not memory: the packages may be gigabytes (torch), tarred in a thread.
        with tempfile.TemporaryFile() as context:
            await asyncio.to_thread(_write_context, context, dockerfile(base_id), site)
            try:
                said = await self._docker.images.build(
                    fileobj=context, encoding="application/x-tar", tag=tag, rm=True, forcerm=True
                )
            except ENGINE_ERRORS as exc:
                raise LearnerStartError(f"the servable image could not be built: {exc}") from exc
        lines = _lines(said)
        failed = [str(line["error"]) for line in lines if "error" in line]
        built = await self._inspect(tag)
        if failed or built is None:
            output = "".join(str(line.get("stream", "")) for line in lines).strip()
            said_last = " / ".join(output.splitlines()[-4:])
            raise LearnerStartError(
                f"the servable image could not be built: {' / '.join(failed)} ({said_last})"[:2000]
            )
        return str(built["Id"])

    async def _inspect(self, image: str) -> dict[str, Any] | None:
        try:
            inspected: dict[str, Any] = await self._docker.images.inspect(image)
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                return None
            raise LearnerStartError(f"the Docker engine: {exc}") from exc
        return inspected


def _lines(said: Any) -> list[dict[str, Any]]:
    return [line for line in said if isinstance(line, dict)] if isinstance(said, list) else []


def _write_context(file: IO[bytes], text: str, site: Path) -> None:
    """The build's context into `file` (rewound): the Dockerfile and the installed packages,
    root's, readable (and where pip made them so, executable) by everyone, writable by none."""

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if info.name == f"{CONTEXT_FOLDER}/{COMPLETE}":
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        if not info.issym():
            info.mode = 0o755 if info.isdir() or info.mode & 0o100 else 0o644
        return info

    with tarfile.open(fileobj=file, mode="w") as tar:
        data = text.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        tar.add(site, arcname=CONTEXT_FOLDER, filter=owned_by_root)
    file.seek(0)
