"""The agents of tests and benchmarks log in as operators set real agents up: each node's agent
as a login that is a member of trainyard_agent only and bound to that node (`trainyard
agent-login create NAME --node NODE`), never as the owner."""

from __future__ import annotations

import hashlib
import re

from controlplane.agents.login_cli import agent_url
from controlplane.agents.logins import LoginExists, bind_agent_login, create_agent_login

AGENT_PASSWORD = "test-agent-password-0001"


def agent_login_name(node: str) -> str:
    """The login of `node`'s agent: `ty_agent_<node>`, its name made a plain identifier (with a
    digest of the real one when that changed it, so that two nodes never share a login)."""
    plain = re.sub(r"[^a-z0-9_]", "_", node.lower())[:40]
    if plain == node:
        return f"ty_agent_{plain}"
    return f"ty_agent_{plain}_{hashlib.sha256(node.encode()).hexdigest()[:8]}"


async def agent_login_url(url: str, node: str) -> str:
    """`url`'s database as `node`'s agent login. Roles are cluster-wide, and several test
    sessions may share one server: the login is created once per server, and bound to its node
    in each database (the binding is the database's)."""
    name = agent_login_name(node)
    try:
        await create_agent_login(url, name, AGENT_PASSWORD, node)
    except LoginExists:
        await bind_agent_login(url, name, node)
    return agent_url(url, name, password=AGENT_PASSWORD)
