"""What an agent's composition root (`node_agent.service`, `node_agent.cli`) needs to start on
Postgres: its settings, the database it is given and checks about its login, telemetry, and
`connect`, the agent's pool as a `PostgresPort`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from controlplane import telemetry
from controlplane.agent_port.postgres import PostgresPort
from controlplane.agents.logins import login_excess, login_node
from controlplane.artifacts.filesystem import default_root
from controlplane.database import AGENT_ROLE, create_pool, create_pooled_pool, resolve_database
from controlplane.migrate import require_migrated
from controlplane.secret_arguments import RefusedSecret, read_secret_file
from controlplane.settings import Settings

__all__ = [
    "AGENT_ROLE",
    "RefusedSecret",
    "Settings",
    "connect",
    "default_root",
    "login_excess",
    "login_node",
    "read_secret_file",
    "require_migrated",
    "resolve_database",
    "setup_telemetry",
]


def setup_telemetry(service: str) -> None:
    telemetry.setup(service)


@asynccontextmanager
async def connect(
    url: str, *, pooled_url: str | None, min_size: int, max_size: int
) -> AsyncIterator[PostgresPort]:
    """The agent's port on a pool of its own, closed on the way out. Whatever the login, the
    agent acts with the agent role's rights only (through pgBouncer, `pooled_url`, by the
    login's own settings, which create_pooled_pool checks: LoginUnprepared otherwise)."""
    if pooled_url is None:
        pool = await create_pool(url, min_size=min_size, max_size=max_size, role=AGENT_ROLE)
    else:
        pool = await create_pooled_pool(pooled_url, min_size=min_size, max_size=max_size)
    try:
        yield PostgresPort(pool)
    finally:
        await pool.close()
