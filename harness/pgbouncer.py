"""A real pgBouncer (Debian's, 1.18) on loopback in front of a Postgres server, in transaction
mode, as docs/operations.md ("Connection budget") sets one up for a fleet's agents: the pooler
tests (tests/ha/test_pooler.py) and `trainyard bench scale` start it with `pgbouncer()`.

Logins are looked up in the server as they come (`auth_query`, as the server URL's user, which
must be a superuser here: the default query reads pg_shadow), so agent logins created after it
started work at once; each login gets a pool of its own, and `max_db_connections` bounds all of
them together (pgBouncer closes an idle server connection of another login's pool to open one
for a login that waits).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import parse_qsl, quote, urlsplit

import asyncpg

from harness.served import free_port
from harness.system_user import give, runs_as

BINARY_DIRS: Final = ("/usr/sbin", "/usr/bin")
"""Debian puts pgbouncer in /usr/sbin, which a user's PATH may lack."""
READY_S: Final = 30.0
"""A bound on how long pgBouncer may take to listen on a loaded machine, never an expectation."""
PROBE_S: Final = 0.05


class PgBouncerUnavailable(RuntimeError):
    """pgBouncer is not installed, or did not come up (the message says why)."""


def binary() -> str | None:
    found = shutil.which("pgbouncer")
    if found is not None:
        return found
    for folder in BINARY_DIRS:
        path = Path(folder) / "pgbouncer"
        if os.access(path, os.X_OK):
            return str(path)
    return None


def missing() -> str | None:
    """Why this machine cannot run pgBouncer (`./dev test` installs it), or None."""
    if binary() is None:
        return "pgbouncer is not installed (apt-get install pgbouncer)"
    return None


@dataclass(frozen=True)
class PgBouncer:
    port: int
    pool_size: int
    """`max_db_connections`: the most server connections it opens to one database, all of its
    logins' pools together."""
    folder: Path

    def url(self, login_url: str) -> str:
        """`login_url`'s login and database through this pgBouncer."""
        parts = urlsplit(login_url)
        query = dict(parse_qsl(parts.query))
        user = parts.username or query.get("user", "")
        password = parts.password or query.get("password", "")
        credentials = f"{quote(user, safe='')}:{quote(password, safe='')}@"
        return f"postgresql://{credentials}127.0.0.1:{self.port}{parts.path}"

    @property
    def log(self) -> Path:
        return self.folder / "pgbouncer.log"


@asynccontextmanager
async def pgbouncer(server_url: str, *, pool_size: int = 5) -> AsyncIterator[PgBouncer]:
    """pgBouncer in transaction mode in front of `server_url`'s server (any of its databases, by
    the name a client gives), at most `pool_size` server connections to each database; stopped
    and its folder removed when the block ends."""
    program = binary()
    if program is None:
        raise PgBouncerUnavailable("pgbouncer is not installed (apt-get install pgbouncer)")
    user = runs_as()
    # Under /tmp (world-traversable), not a test's tmp_path: pgBouncer's user must reach it.
    folder = Path(tempfile.mkdtemp(prefix="trainyard-pgbouncer-"))
    os.chmod(folder, 0o755)
    bouncer = PgBouncer(free_port(), pool_size, folder)
    process: asyncio.subprocess.Process | None = None
    try:
        config = folder / "pgbouncer.ini"
        auth_file = folder / "userlist.txt"
        server = urlsplit(server_url)
        query = dict(parse_qsl(server.query))
        auth_user = server.username or query.get("user", "postgres")
        auth_file.write_text(f'"{auth_user}" "{server.password or query.get("password", "")}"\n')
        config.write_text(
            _config(bouncer, server_url, auth_user=auth_user, auth_file=auth_file), "utf-8"
        )
        for path in (folder, config, auth_file):
            give(path, user)
        os.chmod(auth_file, 0o600)
        with bouncer.log.open("ab") as output:
            give(bouncer.log, user)
            process = await asyncio.create_subprocess_exec(
                program,
                str(config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                process_group=0,
                user=user.pw_uid if user is not None else None,
                group=user.pw_gid if user is not None else None,
                extra_groups=[] if user is not None else None,
            )
        await _until_listening(bouncer, process)
        yield bouncer
    finally:
        # Shielded: a cancelled test must still leave no pgBouncer behind.
        await asyncio.shield(_stop(process))
        shutil.rmtree(folder, ignore_errors=True)


def _config(bouncer: PgBouncer, server_url: str, *, auth_user: str, auth_file: Path) -> str:
    server = urlsplit(server_url)
    query = dict(parse_qsl(server.query))
    # A socket folder (the embedded Postgres's) is a host to pgBouncer as to libpq.
    host = server.hostname or query.get("host", "/var/run/postgresql")
    port = server.port or int(query.get("port", "5432"))
    size = bouncer.pool_size
    return f"""\
[databases]
; Any database, by the name the client gives: the tests' databases come and go.
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {bouncer.port}
unix_socket_dir =
pidfile = {bouncer.folder / "pgbouncer.pid"}
; Transaction mode: a client holds a server connection for one transaction only.
pool_mode = transaction
; One pool per login (each agent's own, for row-level security by login): each may hold
; the whole budget, and all of them together hold no more than it, pgBouncer closing another
; login's idle connection when one is needed.
default_pool_size = {size}
max_db_connections = {size}
max_client_conn = 500
; Logins as the server knows them, looked up when they connect, as the server URL's user.
auth_type = scram-sha-256
auth_user = {auth_user}
auth_file = {auth_file}
"""


async def _until_listening(bouncer: PgBouncer, process: asyncio.subprocess.Process) -> None:
    try:
        async with asyncio.timeout(READY_S):
            while True:
                if process.returncode is not None:
                    raise PgBouncerUnavailable(
                        f"pgbouncer exited with {process.returncode}: "
                        f"{bouncer.log.read_text(errors='replace')[-2000:]}"
                    )
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", bouncer.port)
                except OSError:
                    await asyncio.sleep(PROBE_S)
                    continue
                writer.close()
                await writer.wait_closed()
                return
    except TimeoutError:
        raise PgBouncerUnavailable(
            f"pgbouncer did not listen within {READY_S:.0f}s (log: {bouncer.log})"
        ) from None


async def _stop(process: asyncio.subprocess.Process | None) -> None:
    """SIGTERM: pgBouncer closes every connection at once."""
    if process is None or process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), 10)
    except TimeoutError:
        process.kill()
        await process.wait()


async def server_connections(owner: asyncpg.Connection, logins: Sequence[str]) -> int:
    """How many server connections `logins` hold now (pgBouncer's for them included)."""
    count: int = await owner.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = ANY($1::text[])", list(logins)
    )
    return count
