"""Images for deployments' replicas whose model lists requirements (the Docker runtime): the
learner image the deployment names, plus the requirements installed from the node's
wheelhouse (node_agent/packages.py), built on the node (no registry), once per image and set of
requirements, and tagged by their hash. Nothing is fetched during the build: pip installs from
the wheels it is given, and installing a wheel runs none of its code."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiodocker

from node_agent.docker_runtime import ENGINE_ERRORS
from node_agent.packages import IN_IMAGE, Packages, PackagesError
from node_agent.runtime import LearnerStartError

REPOSITORY = "trainyard-servable"


def dockerfile(base: str, requirements: Sequence[str]) -> str:
    """Two stages: the install happens in the first, the second holds only its result."""
    install = [
        "python3",
        "-m",
        "pip",
        "install",
        "--no-index",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--find-links",
        "/wheelhouse",
        "--target",
        str(IN_IMAGE),
        *requirements,
    ]
    return (
        f"FROM {base} AS install\n"
        # Learner images run as a user of their own; the install writes outside its home.
        "USER root\n"
        "COPY wheelhouse /wheelhouse\n"
        f"RUN {json.dumps(install)}\n"
        f"FROM {base}\n"
        f"COPY --from=install {IN_IMAGE} {IN_IMAGE}\n"
    )


def image_tag(base_id: str, requirements: Sequence[str]) -> str:
    facts = json.dumps([base_id, sorted(requirements)])
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
            return found
        try:
            wheels = await self._packages.wheelhouse(requirements)
        except PackagesError as exc:
            message = f"the model's requirements could not be fetched: {exc}"
            raise LearnerStartError(message) from exc
        context = _context(dockerfile(base_id, requirements), wheels)
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
            # pip's own last words say why (a missing wheel, a Python it does not fit).
            output = "".join(str(line.get("stream", "")) for line in lines).strip()
            said_last = " / ".join(output.splitlines()[-4:])
            raise LearnerStartError(
                f"the servable image could not be built: {' / '.join(failed)} ({said_last})"[:2000]
            )
        return built

    async def _inspect(self, tag: str) -> str | None:
        try:
            inspected = await self._docker.images.inspect(tag)
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                return None
            raise LearnerStartError(f"the Docker engine: {exc}") from exc
        return str(inspected["Id"])


def _lines(said: Any) -> list[dict[str, Any]]:
    return [line for line in said if isinstance(line, dict)] if isinstance(said, list) else []


def _context(text: str, wheels: Path) -> io.BytesIO:
    """The build's context: the Dockerfile and the wheelhouse (its wheels only)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = text.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for wheel in sorted(wheels.glob("*.whl")):
            tar.add(wheel, arcname=f"wheelhouse/{wheel.name}", recursive=False)
    buffer.seek(0)
    return buffer
