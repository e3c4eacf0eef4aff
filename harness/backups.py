"""Continuous archiving and point-in-time restore with pgBackRest, on one machine.

`archived_postgres()` starts a PostgreSQL 15 server in a folder of its own whose WAL goes to a
pgBackRest repository as it is written (`archive_command = pgbackrest archive-push`), with a
stanza created and checked; `Archived.backup()` takes a full backup, `Archived.restore()`
restores it into a fresh data folder and replays the archived WAL up to an instant
(`--type=time`), and `Archived.start_restored()` starts a server there, promoted once it has
reached that instant. `archived_cluster()` archives `harness.ha`'s Patroni cluster the same
way. The restore drills (tests/backups/) and `python -m harness.backups` use them;
docs/operations.md gives the same pgBackRest commands for a real deployment and says how they
fit Patroni.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Final

import aiohttp

from controlplane.database import connect
from controlplane.migrate import migrate
from harness.ha import HaCluster
from harness.served import free_port, until_interrupted
from harness.system_user import SYSTEM_USER, runs_as

PG_BIN: Final = Path("/usr/lib/postgresql/15/bin")
STANZA: Final = "trainyard"
DATABASE: Final = "trainyard"
SUPERUSER: Final = "postgres"
COMMAND_S: Final = 120.0
"""A bound on one pgBackRest or pg_ctl command on a loaded machine, never an expectation."""
PROBE_S: Final = 0.1


class BackupsUnavailable(RuntimeError):
    """pgBackRest or PostgreSQL 15 is not installed, or a command failed (the message says
    which, with its output)."""


def missing() -> str | None:
    """Why this machine cannot archive and restore (`./dev test` installs pgBackRest as root),
    or None."""
    if shutil.which("pgbackrest") is None:
        return "pgbackrest is not installed (apt-get install pgbackrest)"
    if not (PG_BIN / "postgres").exists():
        return f"no PostgreSQL 15 server in {PG_BIN} (apt-get install postgresql-15)"
    return None


@dataclass
class Server:
    """One Postgres server: its data folder and port."""

    data_dir: Path
    port: int

    def url(self, database: str = DATABASE) -> str:
        # Loopback connections are trusted (pg_hba below): the harness's servers live for a
        # test or a demo on one machine; docs/operations.md sets up a real one's passwords.
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"


@dataclass
class Repository:
    """A pgBackRest repository and its stanza's configuration in a folder of its own, and the
    servers restored from it."""

    root: Path
    user: pwd.struct_passwd | None
    restored: list[Server] = field(default_factory=list)

    @property
    def config(self) -> Path:
        """pgBackRest's configuration file: the repository and the stanza."""
        return self.root / "pgbackrest.conf"

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    async def backup(self) -> None:
        """A full backup (`pgbackrest backup --type=full`), with a checkpoint at once."""
        await self.pgbackrest("backup", "--type=full")

    async def check(self) -> None:
        """Switch to a new WAL segment and return once the one before is in the repository
        (`pgbackrest check`): everything committed so far can be restored."""
        await self.pgbackrest("check")

    async def restore(self, target: datetime, into: Path) -> None:
        """Restore the latest backup into the empty folder `into` and have recovery replay the
        archived WAL up to `target` (`--type=time`: every transaction committed at or before
        it, none after), then promote (`--target-action=promote`)."""
        if target.tzinfo is None:
            raise ValueError("a restore target needs its time zone")
        # A fresh folder: pgBackRest refuses to restore over files.
        await asyncio.to_thread(into.mkdir)
        await asyncio.to_thread(_own, into, self.user, 0o700)
        await self.pgbackrest(
            f"--pg1-path={into}",
            "--type=time",
            f"--target={target.isoformat(sep=' ')}",
            "--target-action=promote",
            "restore",
        )

    async def start_restored(self, data_dir: Path) -> Server:
        """Start a server on a restored folder; return once recovery reached its target and
        the server was promoted (it takes writes). Stopped with the rest."""
        server = Server(data_dir, free_port())
        self.restored.append(server)
        await self._pg_ctl(server, "start")
        conn = await connect(server.url("postgres"), role=None)
        try:
            async with asyncio.timeout(COMMAND_S):
                while True:
                    if not await conn.fetchval("SELECT pg_is_in_recovery()"):
                        return server
                    await asyncio.sleep(PROBE_S)
        finally:
            await conn.close()

    async def pgbackrest(self, *args: str) -> str:
        """Run pgBackRest on this stanza (as the data folder's owner); its output."""
        return await _run(
            ["pgbackrest", f"--config={self.config}", f"--stanza={STANZA}", *args],
            self.user,
            self.root,
        )

    async def _pg_ctl(self, server: Server, action: str) -> None:
        # The port and socket folder on the command line, not in postgresql.conf: a restored
        # copy of the folder then starts on a port of its own beside the original.
        options = f"-p {server.port} -c unix_socket_directories={self.root}"
        log = server.data_dir.parent / f"{server.data_dir.name}.log"
        await _run(
            [
                str(PG_BIN / "pg_ctl"),
                *("-D", str(server.data_dir), "-l", str(log), "-o", options),
                *("-w", "-t", str(int(COMMAND_S)), "-m", "fast", action),
            ],
            self.user,
            self.root,
        )


@dataclass
class Archived(Repository):
    """A Postgres whose WAL is archived into a pgBackRest repository."""

    server: Server = field(kw_only=True)

    def url(self, database: str = DATABASE) -> str:
        return self.server.url(database)


@asynccontextmanager
async def archived_postgres(*, keep: bool = False) -> AsyncIterator[Archived]:
    """A fresh Postgres with archiving into a fresh pgBackRest repository, its stanza created
    and checked, database DATABASE created and migrated; every server stopped (and, unless
    `keep`, the folder removed) when the block ends."""
    problem = missing()
    if problem is not None:
        raise BackupsUnavailable(problem)
    user = runs_as()
    # Under /tmp (world-traversable), not a test's tmp_path: Postgres's user must reach it.
    root = Path(tempfile.mkdtemp(prefix="trainyard-backups-"))
    await asyncio.to_thread(_own, root, user, 0o755)
    archived = Archived(root, user, server=Server(root / "data", free_port()))
    try:
        await _initdb(archived)
        # Written as its user: pgBackRest makes the repository's folders with its owner's rights.
        await _run(["mkdir", "-p", str(archived.repo), str(root / "log")], user, root)
        archived.config.write_text(_pgbackrest_config(archived, [(archived.server, root)]))
        await archived._pg_ctl(archived.server, "start")
        await archived.pgbackrest("stanza-create")
        await archived.check()
        await _create_database(archived.server)
        yield archived
    finally:
        # Shielded: a cancelled test must still leave no server behind.
        await asyncio.shield(_stop_all(archived, [*archived.restored, archived.server]))
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


@asynccontextmanager
async def archived_cluster(cluster: HaCluster) -> AsyncIterator[Repository]:
    """Continuous archiving for a Patroni cluster (`harness.ha`), set up as docs/operations.md
    sets up a real one: one repository; a stanza that names every member (pgBackRest backs up
    from whichever is the primary, and each member archives into it while it is); archive_mode
    and archive_command in Patroni's dynamic configuration, and each member restarted by its
    Patroni to take them (the standby first). The servers restored from it are stopped, and
    its folder removed, when the block ends."""
    problem = missing()
    if problem is not None:
        raise BackupsUnavailable(problem)
    user = runs_as()
    root = Path(tempfile.mkdtemp(prefix="trainyard-backups-"))
    await asyncio.to_thread(_own, root, user, 0o755)
    repository = Repository(root, user)
    try:
        await _run(["mkdir", "-p", str(repository.repo), str(root / "log")], user, root)
        servers = [(Server(m.data_dir, m.pg_port), m.folder) for m in cluster.members]
        repository.config.write_text(_pgbackrest_config(repository, servers))
        # Postgres runs archive_command through the shell in its data folder, and pgBackRest
        # wants pg1-path to be the folder of the server that pushes: one command serves every
        # member (on separate machines, each one's pgbackrest.conf names its own folder).
        archive_command = (
            f"pgbackrest --config={repository.config} --stanza={STANZA} "
            '--pg1-path="$PWD" archive-push %p'
        )
        parameters = {"archive_mode": "on", "archive_command": archive_command}
        timeout = aiohttp.ClientTimeout(total=COMMAND_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            primary = await cluster.primary()
            patch = {"postgresql": {"parameters": parameters}}
            async with session.patch(primary.api + "/config", json=patch) as response:
                response.raise_for_status()
            standbys = [m for m in cluster.members if m is not primary]
            for member in [*standbys, primary]:
                await _restart(session, member.api)
        await cluster.primary()
        await repository.pgbackrest("stanza-create")
        await repository.check()
        yield repository
    finally:
        await asyncio.shield(_stop_all(repository, repository.restored))
        shutil.rmtree(root, ignore_errors=True)


async def _restart(session: aiohttp.ClientSession, api: str) -> None:
    """Once a member's Patroni has taken the new configuration (it reports a restart
    pending), have it restart its Postgres; return when it has."""
    async with asyncio.timeout(COMMAND_S):
        while True:
            async with session.get(api + "/patroni") as response:
                status = await response.json(content_type=None)
            if status.get("pending_restart"):
                break
            await asyncio.sleep(PROBE_S)
    async with session.post(api + "/restart", json={}) as response:
        if response.status != 200:
            raise BackupsUnavailable(f"Patroni at {api} did not restart: {await response.text()}")


def _pgbackrest_config(repository: Repository, servers: list[tuple[Server, Path]]) -> str:
    """The repository in `repository`'s folder; the stanza's servers (pg1, pg2, ...: a backup
    is taken from whichever is the primary), each with its socket folder."""
    root = repository.root
    stanza = [
        f"pg{i}-{key}={value}"
        for i, (server, sockets) in enumerate(servers, start=1)
        for key, value in (
            ("path", server.data_dir),
            ("port", server.port),
            ("socket-path", sockets),
            ("user", SUPERUSER),
        )
    ]
    return "\n".join(
        [
            "[global]",
            f"repo1-path={repository.repo}",
            # Two full backups kept; the WAL that the oldest of them needs is kept with it.
            "repo1-retention-full=2",
            f"log-path={root / 'log'}",
            f"lock-path={root / 'lock'}",
            # Its own, not Debian's /var/spool/pgbackrest (root's): restore looks there.
            f"spool-path={root / 'spool'}",
            "log-level-console=warn",
            "log-level-file=info",
            # A backup begins with an immediate checkpoint rather than waiting for the next
            # scheduled one (up to checkpoint_timeout, 5 minutes).
            "start-fast=y",
            "",
            f"[{STANZA}]",
            *stanza,
            "",
        ]
    )


async def _initdb(archived: Archived) -> None:
    data = archived.server.data_dir
    await _run(
        [
            str(PG_BIN / "initdb"),
            *("-D", str(data), "-U", SUPERUSER, "-E", "UTF8", "--data-checksums"),
            *("--auth-local=trust", "--auth-host=trust"),
        ],
        archived.user,
        archived.root,
    )
    archive_command = f"pgbackrest --config={archived.config} --stanza={STANZA} archive-push %p"
    settings = {
        "listen_addresses": "'127.0.0.1'",
        "wal_level": "replica",
        "archive_mode": "on",
        "archive_command": f"'{archive_command}'",
        "max_wal_senders": "3",
        "max_connections": "200",
    }
    with (data / "postgresql.conf").open("a") as conf:
        conf.write("".join(f"{key} = {value}\n" for key, value in settings.items()))


async def _create_database(server: Server) -> None:
    admin = await connect(server.url("postgres"), role=None)
    try:
        await admin.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await admin.close()
    await migrate(server.url())


async def _stop_all(repository: Repository, servers: list[Server]) -> None:
    for server in servers:
        if (server.data_dir / "postmaster.pid").exists():
            try:
                await repository._pg_ctl(server, "stop")
            except BackupsUnavailable:
                _kill(server)


def _kill(server: Server) -> None:
    """SIGQUIT the postmaster of a server that did not stop cleanly (an immediate shutdown)."""
    pid = int((server.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.kill(pid, signal.SIGQUIT)


def _own(path: Path, user: pwd.struct_passwd | None, mode: int) -> None:
    """The folder `path` given `mode` and, when `user` is given, to `user`."""
    path.chmod(mode)
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)


async def _run(argv: list[str], user: pwd.struct_passwd | None, cwd: Path) -> str:
    """Run a command to its end (as `user`, in `cwd`: a folder that user may enter); its
    output, or BackupsUnavailable with the output when it fails."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=cwd,
        user=user.pw_uid if user is not None else None,
        group=user.pw_gid if user is not None else None,
        extra_groups=[] if user is not None else None,
        env={**os.environ, "HOME": user.pw_dir if user is not None else os.environ["HOME"]},
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), COMMAND_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise BackupsUnavailable(f"{' '.join(argv)} took over {COMMAND_S:.0f}s") from None
    text = output.decode(errors="replace")
    if process.returncode != 0:
        raise BackupsUnavailable(f"{' '.join(argv)} exited with {process.returncode}:\n{text}")
    return text


async def _serve(keep: bool) -> None:
    async with archived_postgres(keep=keep) as archived:
        await archived.backup()
        pgbackrest = f"pgbackrest --config={archived.config} --stanza={STANZA}"
        print(f"postgres 127.0.0.1:{archived.server.port}, archived to {archived.repo}")
        print(f"export TRAINYARD_DATABASE_URL='{archived.url()}'")
        print(f"a full backup is taken; more:  {pgbackrest} backup --type=full")
        print(f"what the repository holds:     {pgbackrest} info")
        print(
            f"restore to an instant:         {pgbackrest} --pg1-path=NEW_EMPTY_FOLDER "
            "--type=time '--target=YYYY-MM-DD HH:MM:SS+00' --target-action=promote restore"
        )
        if archived.user is not None:
            print(f"(as root, run them as {archived.user.pw_name}: runuser -u {SYSTEM_USER} --)")
        await until_interrupted()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m harness.backups",
        description="Run a Postgres whose WAL is archived by pgBackRest, with Trainyard's "
        "database migrated and a full backup taken, until Ctrl-C; print the commands that back "
        "it up and restore it to an instant.",
    )
    parser.add_argument("--keep", action="store_true", help="keep the folder afterwards")
    args = parser.parse_args()
    try:
        asyncio.run(_serve(args.keep))
    except BackupsUnavailable as exc:
        print(f"backups: error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
