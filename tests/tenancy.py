"""Tenants and tokens for tests that go through the authenticated API."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass

import asyncpg

from harness.served import ServedControlPlane


def auth(token: str) -> dict[str, str]:
    """The header that presents `token`."""
    return {"Authorization": f"Bearer {token}"}


async def event_count(owner: asyncpg.Connection) -> int:
    """Every event in the log: what a refused request must leave as it was."""
    return int(await owner.fetchval("SELECT count(*) FROM events"))


@dataclass(frozen=True)
class Tokens:
    acme: str
    globex: str
    admin: str


class Cli:
    """`trainyard` as the control plane's operator runs it: TRAINYARD_HOME is the control
    plane's, so the admin token comes from its file."""

    def __init__(self, served: ServedControlPlane) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
        self.env = {**env, "TRAINYARD_HOME": str(served.home), "TRAINYARD_SERVER": served.url}

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "cli", "tenants", *args),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode is not None
        return process.returncode, stdout.decode(), stderr.decode()
