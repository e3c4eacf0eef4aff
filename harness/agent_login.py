"""The agents of tests and benchmarks log in as operators set real agents up: as a login that
is a member of trainyard_agent only (`trainyard agent-login create`), never as the owner."""

from __future__ import annotations

import contextlib

from controlplane.agents.login_cli import agent_url
from controlplane.agents.logins import LoginExists, create_agent_login

AGENT_LOGIN = "ty_agent_login"
AGENT_PASSWORD = "test-agent-password-0001"


async def agent_login_url(url: str) -> str:
    """`url`'s database as the agent login (created once per server: roles are cluster-wide,
    and several test sessions may share one server)."""
    with contextlib.suppress(LoginExists):
        await create_agent_login(url, AGENT_LOGIN, AGENT_PASSWORD)
    return agent_url(url, AGENT_LOGIN, password=AGENT_PASSWORD)
