"""The Python packages a model's metadata lists (`servable.requirements`), made ready on the node
for its replicas: a wheelhouse fetched by the host, then installed into a folder of their own,
both cached by the requirements' content hash, so that every replica of every deployment that
needs the same packages shares one install.

Only wheels are fetched (`--only-binary=:all:`): a source distribution's build would run its
author's code on the node, as the agent; a wheel installs by unpacking. The requirements are
names and versions only (the metadata schema refuses URLs, options and markers), so no tenant
chooses where pip looks. The install is the agent's own pip's, on the node, without a network
(`--no-index`, from the wheelhouse): no tenant image runs it (docs/servable-packages.md). What
runs the packages' code is the replica, in its sandbox.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform
import shutil
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

BUILD_TIMEOUT_S = 900.0
"""Fetching and installing one set of requirements; torch's wheels alone are gigabytes."""
COMPLETE = ".complete"
PIP = ("-m", "pip", "--disable-pip-version-check", "--no-input")


class PackagesError(Exception):
    """The requirements could not be fetched or installed (the message has pip's own words)."""


def requirements_key(requirements: Sequence[str], python: str) -> str:
    """What identifies an install: the requirements (in any order) and the interpreter and
    machine it is for (a wheel built for one Python fits no other)."""
    facts = [sorted(requirements), python, platform.machine()]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()


IN_IMAGE = Path("/opt/trainyard-packages")
"""Where a servable image (node_agent/servable_images.py) has the requirements: a copy of the
folder `Packages.site` made."""

Site = Callable[[Sequence[str]], Awaitable[Path]]
"""Where a replica finds its model's requirements installed (made ready first, if need be)."""


async def in_image(requirements: Sequence[str]) -> Path:
    """A container replica's: its image has them (the runtime built it before it started)."""
    return IN_IMAGE


class Packages:
    """Installs under `root`, one folder per requirements key (`<key>/wheelhouse`, and
    `<key>/site` for the process runtime), each made whole in a folder of its own and renamed
    into place, so a crash mid-way leaves nothing half-made."""

    def __init__(self, root: Path, python: str = sys.executable) -> None:
        self._root = root
        self._python = python
        self._tag = f"{sys.implementation.cache_tag}"
        self._locks: dict[str, asyncio.Lock] = {}

    async def wheelhouse(self, requirements: Sequence[str]) -> Path:
        """A folder of the wheels `requirements` need (`site` installs from it);
        PackagesError saying why it could not be made."""

        async def download(folder: Path) -> None:
            await self._pip("download", "--only-binary=:all:", "--dest", str(folder), *requirements)

        return await self._made(requirements, "wheelhouse", download)

    async def site(self, requirements: Sequence[str]) -> Path:
        """The folder holding `requirements` installed (what a replica of the process runtime
        puts on its path, and what a servable image copies); PackagesError saying why it could
        not be made."""
        wheels = await self.wheelhouse(requirements)

        async def install(folder: Path) -> None:
            await self._pip(
                "install",
                "--no-index",
                "--find-links",
                str(wheels),
                "--target",
                str(folder),
                "--no-compile",
                *requirements,
            )

        return await self._made(requirements, "site", install)

    async def _made(
        self, requirements: Sequence[str], part: str, make: Callable[[Path], Awaitable[None]]
    ) -> Path:
        """`<key>/<part>`, made by `make` into a folder of its own first, once."""
        key = requirements_key(requirements, self._tag)
        final = self._root / key / part
        async with self._locks.setdefault(f"{key}/{part}", asyncio.Lock()):
            if (final / COMPLETE).exists():
                return final
            final.parent.mkdir(parents=True, exist_ok=True)
            # Replicas, which run as users of their own, read the installed packages.
            for folder in (self._root, final.parent):
                folder.chmod(0o755)
            work = final.parent / f".{part}.{uuid.uuid4().hex}"
            work.mkdir(mode=0o755)
            try:
                await make(work)
                (work / COMPLETE).touch()
                shutil.rmtree(final, ignore_errors=True)  # an incomplete one a crash left
                work.rename(final)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return final

    async def _pip(self, *arguments: str) -> None:
        process = await asyncio.create_subprocess_exec(
            self._python,
            *PIP,
            *arguments,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONNOUSERSITE": "1"},
        )
        try:
            async with asyncio.timeout(BUILD_TIMEOUT_S):
                _, stderr = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise PackagesError(f"pip {arguments[0]} took over {BUILD_TIMEOUT_S:.0f}s") from None
        if process.returncode != 0:
            said = stderr.decode(errors="replace").strip().splitlines()[-5:]
            raise PackagesError(f"pip {arguments[0]} failed: {' / '.join(said)}")
