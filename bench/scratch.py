"""A migrated scratch database for one benchmark run, dropped afterwards."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from controlplane.database import connect, with_database
from controlplane.migrate import migrate


@asynccontextmanager
async def scratch_database(url: str, name: str) -> AsyncIterator[str]:
    """Yield the URL of a fresh, migrated database on the server of `url`."""
    scratch = f"trainyard_bench_{name}_{os.getpid()}"
    admin = await connect(url, role=None)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{scratch}"')
        await admin.execute(f'CREATE DATABASE "{scratch}"')
        try:
            scratch_url = with_database(url, scratch)
            await migrate(scratch_url)
            yield scratch_url
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
    finally:
        await admin.close()
