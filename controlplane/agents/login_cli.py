"""`trainyard agent-login create NAME --node NODE`: a database login for one node's agent, and
`agent-login bind NAME --node NODE` for a login made before logins were bound (or a machine
renamed); run by an operator with the owner's database URL. Exit codes as every command's
(`controlplane.failures`): 2 for bad input, 1 when the login cannot be created or bound, 3 when
the database cannot be reached; nothing changes on error."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import asyncpg

from controlplane.agents.logins import (
    MIN_PASSWORD,
    InvalidLogin,
    LoginExists,
    bind_agent_login,
    check_login_name,
    check_node_name,
    create_agent_login,
)
from controlplane.database import hosts, resolve_database
from controlplane.failures import EXIT_FAILED, EXIT_USAGE
from controlplane.migrate import require_migrated
from controlplane.settings import Settings

PASSWORD_ENV = "TRAINYARD_AGENT_PASSWORD"
NODE_HELP = "the node whose work it may reach: the agent's --name (default: its host name)"


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the `agent-login` command group to the top-level subcommands."""
    logins = commands.add_parser(
        "agent-login",
        help="create database logins for node agents (operator)",
        description="Node agents should not log in to Postgres with the owner's URL: a "
        "compromised node would be the whole service. An agent login is a member of the "
        "trainyard_agent role only (claims, heartbeats, log lines and the agents' own events; "
        "no tokens, no webhook secrets, no tenants' events), bound to one node: it reaches the "
        "secrets, events, log lines and serving tasks of the work on that node only (see "
        "docs/agent-role.md). Run with the owner's $TRAINYARD_DATABASE_URL (a login that may "
        "create roles).",
    )
    group = logins.add_subparsers(title="commands", required=True, metavar="COMMAND")
    create = group.add_parser(
        "create",
        help="create a login that is a member of trainyard_agent only, for one node",
        description="Create the LOGIN role NAME, a member of trainyard_agent and of nothing "
        "else, bound to node NODE (the agent's --name), with its sessions' settings as its "
        "own (role, jit, plan_cache_mode: what an agent through pgBouncer cannot send). Its "
        "SCRAM-SHA-256 verifier is computed here, so the password never reaches the server "
        "or its logs. The password "
        f"(printable ASCII, at least {MIN_PASSWORD} characters) comes from --password-file "
        f"or ${PASSWORD_ENV}. Prints the URL to give `trainyard agent install "
        "--database-url` (password masked).",
    )
    create.add_argument("name", metavar="NAME", help="lowercase letters, digits and '_'")
    create.add_argument("--node", required=True, metavar="NODE", help=NODE_HELP)
    create.add_argument(
        "--password-file",
        type=Path,
        metavar="FILE",
        help=f"a file holding the password (one line); default: ${PASSWORD_ENV}",
    )
    create.set_defaults(handler=cmd_create)
    bind = group.add_parser(
        "bind",
        help="bind an existing agent login to the node it works for",
        description="Bind the agent login NAME to node NODE in this database: from its next "
        "statement on it reaches that node's work and no other's. For logins created before "
        "logins were bound (they reach no node's work until bound), and for a login whose "
        "machine took another node name. It also gives the login its sessions' settings, which "
        "logins created before had not (an agent through pgBouncer needs them).",
    )
    bind.add_argument("name", metavar="NAME", help="an existing agent login")
    bind.add_argument("--node", required=True, metavar="NODE", help=NODE_HELP)
    bind.set_defaults(handler=cmd_bind)


async def cmd_create(args: argparse.Namespace, settings: Settings) -> int:
    try:
        name = check_login_name(args.name)
        node = check_node_name(args.node)
        password = _password(args.password_file)
    except InvalidLogin as exc:
        return _error("create", str(exc), EXIT_USAGE)
    url = await resolve_database(settings)
    await require_migrated(url)
    try:
        await create_agent_login(url, name, password, node)
    except InvalidLogin as exc:
        return _error("create", str(exc), EXIT_USAGE)
    except LoginExists as exc:
        return _error("create", str(exc), EXIT_FAILED)
    except asyncpg.InsufficientPrivilegeError as exc:
        return _error(
            "create",
            f"this database login may not create roles ({exc}); run with the owner's URL "
            "or a login with CREATEROLE",
            EXIT_FAILED,
        )
    print(
        f"created database login {name!r}, a member of trainyard_agent only, for node {node!r}",
        file=sys.stderr,
    )
    print(agent_url(url, name))
    return 0


async def cmd_bind(args: argparse.Namespace, settings: Settings) -> int:
    try:
        name = check_login_name(args.name)
        node = check_node_name(args.node)
    except InvalidLogin as exc:
        return _error("bind", str(exc), EXIT_USAGE)
    url = await resolve_database(settings)
    await require_migrated(url)
    try:
        before = await bind_agent_login(url, name, node)
    except InvalidLogin as exc:
        return _error("bind", str(exc), EXIT_FAILED)
    except asyncpg.InsufficientPrivilegeError as exc:
        return _error(
            "bind",
            f"this database login may not bind agent logins ({exc}); run with the owner's URL",
            EXIT_FAILED,
        )
    moved = f" (was {before!r})" if before is not None and before != node else ""
    print(f"database login {name!r} works for node {node!r}{moved}", file=sys.stderr)
    return 0


def agent_url(url: str, name: str, *, password: str = "PASSWORD") -> str:
    """The URL an agent logs in with: `url`'s server and database as `name`; by default with
    the password left for the operator to fill in (it is never printed, nor the owner's)."""
    parts = urlsplit(url)
    # The owner's user and password may be parameters too (postgresql:///db?host=...&user=...).
    kept = [
        (key, value)
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
        if key not in ("user", "password", "passfile")
    ]
    query = f"?{urlencode(kept, quote_via=quote, safe='/')}" if kept else ""
    credentials = f"{quote(name)}:{quote(password, safe='')}"
    return f"{parts.scheme}://{credentials}@{hosts(url)}{parts.path}{query}"


def _password(path: Path | None) -> str:
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidLogin(f"--password-file {str(path)!r} cannot be read ({exc})") from None
        return text.removesuffix("\n").removesuffix("\r")
    password = os.environ.get(PASSWORD_ENV)
    if not password:
        raise InvalidLogin(f"no password: pass --password-file FILE or set ${PASSWORD_ENV}")
    return password


def _error(command: str, message: str, code: int) -> int:
    print(f"trainyard agent-login {command}: error: {message}", file=sys.stderr)
    return code
