"""Database logins for node agents: members of `trainyard_agent` only (see
migrations/0014_agent_role.sql), each bound to the node it works for (migrations/0032: it reaches
only that node's work), created with a password the server never sees, and the check an agent
makes of what it logged in as."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

import asyncpg

from controlplane.database import AGENT_ROLE, connect, login_settings
from controlplane.queries import Q

LOGIN_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""Lowercase, so that the name needs no quoting in a URL or in psql; Postgres's length limit."""
RESERVED_PREFIXES = ("pg_", "trainyard_")
"""Postgres's own roles, and ours (the application's, the agents', the auditors')."""
MAX_NODE_NAME = 253
"""A host name's length: nodes are named after their hosts by default."""
MIN_PASSWORD = 16
SCRAM_ITERATIONS = 4096
"""Postgres's default (scram_iterations): what its own clients compute."""


class InvalidLogin(ValueError):
    """A name or password that cannot make an agent login (the message says which)."""


class LoginExists(Exception):
    """A role of that name exists already; nothing was changed."""


def check_login_name(name: str) -> str:
    if not LOGIN_NAME.fullmatch(name):
        raise InvalidLogin(
            f"NAME {name!r}: use lowercase letters, digits and '_', starting with a letter or "
            "'_' (at most 63)"
        )
    if name.startswith(RESERVED_PREFIXES):
        raise InvalidLogin(f"NAME {name!r}: names starting with pg_ or trainyard_ are reserved")
    return name


def check_node_name(node: str) -> str:
    if not node or len(node) > MAX_NODE_NAME or not node.isprintable() or node.strip() != node:
        raise InvalidLogin(
            f"--node {node!r}: a node's name (as `trainyard agent --name` gives it), printable, "
            f"without leading or trailing spaces, at most {MAX_NODE_NAME} characters"
        )
    return node


def check_password(password: str) -> str:
    """Printable ASCII only: Postgres prepares other passwords (SASLprep) before hashing them,
    and a verifier computed here without that step would never match."""
    if not password.isascii() or not password.isprintable():
        raise InvalidLogin("the password must be printable ASCII characters")
    if len(password) < MIN_PASSWORD:
        raise InvalidLogin(f"the password must be at least {MIN_PASSWORD} characters long")
    return password


def scram_verifier(password: str, *, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier Postgres stores for `password` (RFC 5802, RFC 7677), in the
    form CREATE ROLE ... PASSWORD accepts as it is, without seeing the password."""
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


async def create_agent_login(url: str, name: str, password: str, node: str) -> None:
    """Create the LOGIN role `name`, a member of trainyard_agent only, bound to `node`, with
    its sessions' settings as its own (for sessions through pgBouncer), as the login of `url`
    (which needs CREATEROLE). LoginExists if the name is taken; InvalidLogin for
    bad input. The role and its binding are made in one transaction: never one without the
    other."""
    check_login_name(name)
    check_node_name(node)
    verifier = scram_verifier(check_password(password))
    conn = await connect(url, role=None)
    try:
        await _require_agent_role(conn)
        if await conn.fetchval(Q["role_exists"], name):
            raise LoginExists(f"a database role named {name!r} exists already; nothing was changed")
        statement = await conn.fetchval(Q["create_agent_login_statement"], name, verifier)
        try:
            async with conn.transaction():
                await conn.execute(statement)
                await _give_settings(conn, name)
                await conn.execute(Q["bind_agent_login"], name, node)
        except asyncpg.DuplicateObjectError as exc:  # created meanwhile by someone else
            raise LoginExists(
                f"a database role named {name!r} exists already; nothing was changed"
            ) from exc
    finally:
        await conn.close()


async def bind_agent_login(url: str, name: str, node: str) -> str | None:
    """Bind the existing agent login `name` to `node` in `url`'s database (a login made before
    logins were bound, or one moved to another machine), and give it its sessions' settings
    (a login made before it had them), as the login of `url` (the owner's).
    Returns the node it was bound to before, if any. InvalidLogin when `name` is not a login
    of the agent role."""
    check_login_name(name)
    check_node_name(node)
    conn = await connect(url, role=None)
    try:
        await _require_agent_role(conn)
        if not await conn.fetchval(Q["is_agent_login"], name):
            raise InvalidLogin(
                f"NAME {name!r}: no login of that name is a member of {AGENT_ROLE} (create "
                "one with `trainyard agent-login create`)"
            )
        async with conn.transaction():
            before: str | None = await conn.fetchval(Q["agent_login_node"], name)
            # A login created before logins carried their settings gets them here.
            await _give_settings(conn, name)
            await conn.execute(Q["bind_agent_login"], name, node)
    finally:
        await conn.close()
    return before


async def _give_settings(conn: asyncpg.Connection, name: str) -> None:
    """Make `database.login_settings()` the login's own, so that its sessions through pgBouncer
    run as the agent role with the planner settings (`database.create_pooled_pool`)."""
    settings = login_settings()
    statements = await conn.fetch(
        Q["agent_login_settings_statements"], name, list(settings), list(settings.values())
    )
    for (statement,) in statements:
        await conn.execute(statement)


async def _require_agent_role(conn: asyncpg.Connection) -> None:
    if not await conn.fetchval(Q["role_exists"], AGENT_ROLE):
        raise InvalidLogin(f"the database has no role {AGENT_ROLE}: run `trainyard migrate` first")


async def login_excess(url: str) -> list[str]:
    """What the login of `url` may do beyond the agent role (empty: nothing), in words."""
    conn = await connect(url, role=None)
    try:
        excess: list[str] = await conn.fetchval(Q["login_excess"])
    finally:
        await conn.close()
    return excess


async def login_node(url: str) -> str | None:
    """The node the login of `url` works for (None: bound to none, so it reaches no node's
    work)."""
    conn = await connect(url, role=None)
    try:
        node: str | None = await conn.fetchval(Q["session_login_node"])
    finally:
        await conn.close()
    return node
