"""Servable images (the Docker runtime's replicas whose model lists requirements) are made
without running the tenant's image: the agent's pip installs the requirements on the node, and
the build copies them in. A `python3` the tenant replaced never runs during it (it would, as
root and with the build's network, if pip ran in the image); an image with `ONBUILD` triggers
is refused before any build. The packages are root's in the image, whose user stays its own."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiodocker
import pytest

from node_agent.images import LEARNER_IMAGE
from node_agent.packages import IN_IMAGE, Packages
from node_agent.runtime import LearnerStartError
from node_agent.servable_images import ServableImages, image_tag
from tests.controlplane.deployments.test_serving_requirements import build_wheel
from tests.docker_engine import require_engine

require_engine()  # or the whole module skips (on CI: fails)
pytestmark = pytest.mark.docker

REQUIREMENTS = ["tinytrainyardpkg==1.0"]
WITNESS = "ran-as.txt"
"""What the tenant's code writes where the packages go, if it runs: its uid and its network
interfaces (an image built from it would then carry the file)."""
REPORT = f"mkdir -p {IN_IMAGE} && {{ id -u; ls /sys/class/net; }} > {IN_IMAGE}/{WITNESS}"

# The learner image's `python3`, which pip would be run by, made to report who runs it.
REPLACED_PYTHON = f"""FROM {LEARNER_IMAGE}
USER root
RUN mv /opt/learner/bin/python3 /opt/learner/bin/python3.real \\
    && printf '#!/bin/sh\\n%s\\nexec /opt/learner/bin/python3.real "$@"\\n' {json.dumps(REPORT)} \\
        > /opt/learner/bin/python3 && chmod 755 /opt/learner/bin/python3
USER 1000:1000
"""

# Root's image (a replica still runs as its job's user): its trigger would run as root.
ONBUILD = f"""FROM {LEARNER_IMAGE}
USER root
ONBUILD RUN {REPORT}
"""


@pytest.fixture
async def docker() -> AsyncIterator[aiodocker.Docker]:
    async with aiodocker.Docker() as client:
        yield client


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Packages:
    """The node's packages, fetched by its pip as its settings say (a local folder here)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return Packages(tmp_path / "packages")


class TenantImages:
    """Tenants' images built from Dockerfiles, removed with their servable images at the end."""

    def __init__(self, docker: aiodocker.Docker) -> None:
        self._docker = docker
        self.built: list[str] = []

    async def build(self, dockerfile: str) -> str:
        """The built image's ID."""
        tag = f"trainyard-test-tenant:{uuid.uuid4().hex[:12]}"
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(dockerfile.encode())
            tar.addfile(info, io.BytesIO(dockerfile.encode()))
        context.seek(0)
        await self._docker.images.build(fileobj=context, encoding="application/x-tar", tag=tag)
        self.built.append(tag)
        return str((await self._docker.images.inspect(tag))["Id"])

    async def remove(self) -> None:
        for tag in self.built:
            image_id = str((await self._docker.images.inspect(tag))["Id"])
            for name in (image_tag(image_id, REQUIREMENTS), tag):
                try:
                    await self._docker.images.delete(name, force=True)
                except aiodocker.DockerError as exc:
                    assert exc.status == 404, exc


@pytest.fixture
async def tenant_images(docker: aiodocker.Docker) -> AsyncIterator[TenantImages]:
    images = TenantImages(docker)
    yield images
    await images.remove()


async def file_in(docker: aiodocker.Docker, image: str, path: Path) -> tarfile.TarInfo | None:
    """`path` in `image` as its archive lists it (None: not there), read from a container that
    is created, never started."""
    container = await docker.containers.create({"Image": image, "Cmd": ["true"]})
    try:
        archive = await container.get_archive(str(path))
    except aiodocker.DockerError as exc:
        if exc.status == 404:
            return None
        raise
    finally:
        await container.delete(force=True)
    return archive.getmember(path.name)


async def test_a_replaced_python3_never_runs_and_the_packages_are_copied_in(
    docker: aiodocker.Docker, packages: Packages, tenant_images: TenantImages
) -> None:
    base = await tenant_images.build(REPLACED_PYTHON)
    image = await ServableImages(docker, packages).image(base, REQUIREMENTS)
    assert await file_in(docker, image, IN_IMAGE / WITNESS) is None, "the tenant's python3 ran"
    installed = await file_in(docker, image, IN_IMAGE / "tinytrainyardpkg" / "__init__.py")
    assert installed is not None
    # Root's, and no replica's to change; the replica runs as the image's user, not root.
    assert (installed.uid, installed.mode & 0o777) == (0, 0o644)
    inspected = await docker.images.inspect(image)
    assert inspected["Config"]["User"] == "1000:1000"
    # Made once: the next replica of these requirements on this image takes it as it is.
    assert await ServableImages(docker, packages).image(base, REQUIREMENTS) == image


async def test_an_image_with_onbuild_triggers_is_refused_before_any_build(
    docker: aiodocker.Docker, packages: Packages, tenant_images: TenantImages
) -> None:
    base = await tenant_images.build(ONBUILD)
    with pytest.raises(LearnerStartError, match=r"has ONBUILD triggers .*ran-as\.txt"):
        await ServableImages(docker, packages).image(base, REQUIREMENTS)
    listed = await docker.images.list(filters={"reference": [image_tag(base, REQUIREMENTS)]})
    assert listed == []
