"""Finding, starting and connecting to Trainyard's Postgres.

The database is `TRAINYARD_DATABASE_URL` when set, otherwise an embedded Postgres (the
`pgserver` wheel) kept under the data directory. The control plane's sessions run as the
`trainyard_app` role, which may append events but never change them; node agents' sessions as
`trainyard_agent`, which may only claim, heartbeat, ship logs and append the agents' own events
(migrations/0014_agent_role.sql); migrations run as the connecting user, who owns the schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from typing import Any, Final, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from controlplane.failures import BackendUnreachable, CommandFailed
from controlplane.invariants import InvariantBroken
from controlplane.queries import Q
from controlplane.settings import Settings

APP_ROLE: Final = "trainyard_app"
AGENT_ROLE: Final = "trainyard_agent"
Role = Literal["trainyard_app", "trainyard_agent"]
"""The role a session runs as (SET ROLE at connection start); None: the login's own rights."""
APPLICATION_NAME: Final = "trainyard"
PLANNER_SETTINGS: Final = {"jit": "off", "plan_cache_mode": "force_generic_plan"}
"""Every session's planner settings (why: `_settings`)."""


DATABASE_ERRORS = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # What asyncpg raises for an operation on a connection whose server end was terminated
    # while another operation was under way.
    asyncpg.InternalClientError,
)
"""What a lost or failing database connection raises: background loops retry on these."""

CONNECTION_ERRORS = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    # The server shutting down or terminating the session (admin_shutdown, ...).
    asyncpg.exceptions.OperatorInterventionError,
)
"""What a lost connection raises, unlike an error of the statement itself: retrying the same
work later may succeed, however often it failed."""


class DatabaseUnavailable(BackendUnreachable):
    """The database cannot be reached or started; the message is one line for the operator."""


class LoginUnprepared(CommandFailed):
    """Sessions through the pooler do not run as the agent role with the planner settings: the
    login lacks the settings `trainyard agent-login create` and `bind` give it."""


class Executor(Protocol):
    """What the store needs of a pool or a connection (possibly inside a transaction)."""

    async def execute(self, query: str, *args: Any) -> str: ...
    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]: ...
    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None: ...
    async def fetchval(self, query: str, *args: Any) -> Any: ...


EMBEDDED_DATABASE = "trainyard"


async def resolve_database(settings: Settings) -> str:
    """The configured database URL, or the embedded Postgres's `trainyard` database.

    The embedded server is started when not running, and its database created when missing.
    """
    if settings.database_url:
        return settings.database_url
    server = embedded_server_url(settings)
    conn = await connect(server, role=None)
    try:
        exists = await conn.fetchval(Q["database_exists"], EMBEDDED_DATABASE)
        if not exists:
            # Another process starting at the same moment may create it first.
            with contextlib.suppress(asyncpg.DuplicateDatabaseError):
                await conn.execute(f'CREATE DATABASE "{EMBEDDED_DATABASE}"')
    finally:
        await conn.close()
    return with_database(server, EMBEDDED_DATABASE)


def embedded_server_url(settings: Settings) -> str:
    """Start (or join) the embedded Postgres under the data directory; its maintenance URL.

    pgserver stops the server when the last process that asked for it exits.
    """
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (as under CI) and falls back to /tmp.
        warnings.simplefilter("ignore")
        # Imported late: it sets up its lock files on import.
        from pgserver.postgres_server import get_server

    pgdata = settings.home / "postgres"
    pgdata.mkdir(parents=True, exist_ok=True)
    try:
        server = get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:  # pgserver raises plain exceptions of several kinds
        raise DatabaseUnavailable(f"cannot start the embedded Postgres in {pgdata}: {exc}") from exc
    return str(server.get_uri())


def with_database(url: str, name: str) -> str:
    """The same server's URL for another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def hosts(url: str) -> str:
    """The URL's hosts and ports as written, without the user and password: `h:5432`, or
    libpq's multi-host form `h1:5432,h2:5432` (whose `port` urllib cannot parse), or empty for
    the local socket."""
    return urlsplit(url).netloc.rpartition("@")[2]


def describe(url: str) -> str:
    """A URL fit for messages: hosts, ports and database, never the password."""
    return f"{hosts(url) or 'local socket'}{urlsplit(url).path or '/'}"


async def connect(url: str, *, role: Role | None = APP_ROLE) -> asyncpg.Connection:
    """One connection, as `role` (None: as the login itself, for migrations)."""
    try:
        return await asyncpg.connect(url, server_settings=_settings(role), timeout=10)
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        raise _unreachable(url, exc) from exc


async def create_pool(
    url: str, *, min_size: int = 2, max_size: int = 10, role: Role | None = APP_ROLE
) -> asyncpg.Pool:
    """A pool of connections that all run as `role`: the control plane's, or an agent's (None:
    as the login itself, for a benchmark's bulk load of history)."""
    return await _pool(url, min_size, max_size, server_settings=_settings(role))


async def create_pooled_pool(url: str, *, min_size: int, max_size: int) -> asyncpg.Pool:
    """A pool whose connections go through pgBouncer in transaction mode (`url` is pgBouncer's),
    for an agent login's queries: a fleet's agents then share pgBouncer's server connections
    (docs/operations.md, "Connection budget").

    Each transaction may run on another server connection, so nothing may outlive one: no
    named prepared statements (asyncpg's statement cache; a statement is prepared unnamed and
    run in the same exchange), and no startup settings but the application's name, which
    pgBouncer 1.18 refuses. The login's own settings give the session its role, JIT and plan
    cache mode instead (`login_settings`, written by `trainyard agent-login create` and
    `bind`); LoginUnprepared when they are not there, rather than an agent that would run as
    the login with the planner's defaults."""
    pool = await _pool(
        url,
        min_size,
        max_size,
        server_settings={"application_name": APPLICATION_NAME},
        statement_cache_size=0,
    )
    try:
        session = await pool.fetchrow(Q["session_settings"])
        if session is None:
            raise InvariantBroken("session_settings returned no row")
        wanted = login_settings()
        found = {key: session[key] for key in wanted}
        if found != wanted:
            raise LoginUnprepared(
                f"sessions through the pooler at {describe(url)} run with {found}, not "
                f"{wanted}: give the agent login its settings (as the database's owner: "
                "trainyard agent-login bind NAME --node NODE)"
            )
    except BaseException:
        # Shielded: a cancelled start must still close what it opened.
        await asyncio.shield(pool.close())
        raise
    return pool


async def _pool(
    url: str,
    min_size: int,
    max_size: int,
    *,
    server_settings: dict[str, str],
    statement_cache_size: int = 100,
) -> asyncpg.Pool:
    try:
        pool = await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            server_settings=server_settings,
            statement_cache_size=statement_cache_size,
            reset=_keep_session,
            timeout=10,
        )
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        raise _unreachable(url, exc) from exc
    if pool is None:  # only a pool created without awaiting it is None
        raise InvariantBroken("asyncpg.create_pool returned no pool")
    return pool


def _unreachable(url: str, exc: BaseException) -> DatabaseUnavailable:
    return DatabaseUnavailable(f"cannot connect to the database at {describe(url)}: {exc}")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Return a connection to the pool as it is (asyncpg still rolls back a transaction left
    open). Nothing here leaves session state on a pooled connection: LISTEN and session
    advisory locks use connections of their own. The default reset (RESET ALL, CLOSE ALL,
    UNLISTEN *, unlock all) is a round trip on every release, more than one per claimed job."""


def _settings(role: Role | None) -> dict[str, str]:
    # Startup settings rather than SET, so that they hold for the whole session (RESET ROLE
    # brings back the login's rights: the role is what the code runs as, not a sandbox; an
    # agent's login is kept to the agent role by being a member of nothing else).
    # No JIT: every statement here is a short one on indexes, but a claim's many subqueries
    # make the planner's cost estimate pass jit_above_cost, and compiling it then took 70 ms
    # on a server built with LLVM (Debian's Postgres), against 0.5 ms to run it.
    # Generic plans: Postgres kept planning our prepared statements anew at every call (their
    # array parameters make a generic plan look dearer than it is), and planning took as long
    # as running them (0.2 ms of 0.4 for an append, 0.65 of 1 for a claim). The one statement
    # whose best plan depends on its values plans per call (`plan_per_call`, listing jobs).
    settings = {"application_name": APPLICATION_NAME, **PLANNER_SETTINGS}
    if role is not None:
        settings["role"] = role
    return settings


def login_settings() -> dict[str, str]:
    """What an agent login's sessions must start with when they cannot be sent at connection
    start (through pgBouncer): the agent role and the planner settings, set on the login
    itself (ALTER ROLE ... SET) by `trainyard agent-login create` and `bind`."""
    return {"role": AGENT_ROLE, **PLANNER_SETTINGS}


async def ping(db: Executor) -> None:
    """Return once the database answered a trivial query; a DATABASE_ERRORS error if not."""
    await db.fetchval(Q["ping"])
