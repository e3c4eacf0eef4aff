"""A replicated Postgres on one machine, run by a real HA manager: one etcd, two Postgres 15
servers each under its own Patroni, a primary and a synchronous standby (synchronous_mode), on
loopback ports in a folder of its own. The failover tests and `trainyard bench failover` start
it with `ha_cluster()`; `./dev ha` (or `python -m harness.ha`) starts it for a person and prints
the multi-host URL that every Trainyard process is given. docs/failover.md says how a real
deployment differs (three etcd members on three machines, a password file, TLS).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import asyncpg

from controlplane.database import connect
from controlplane.migrate import migrate
from harness.served import free_ports, until_interrupted
from harness.system_user import give, runs_as

PG_BIN: Final = Path("/usr/lib/postgresql/15/bin")
SCOPE: Final = "trainyard"
DATABASE: Final = "trainyard"
SUPERUSER: Final = "postgres"
SUPERUSER_PASSWORD: Final = "ha-superuser-password"
REPLICATION_USER: Final = "replicator"
REPLICATION_PASSWORD: Final = "ha-replication-password"
TTL_S: Final = 10
"""The leader key's TTL in etcd: how long a primary whose Patroni died (a lost machine) keeps
the lock. A crashed Postgres under a live Patroni fails over within LOOP_WAIT_S
(primary_start_timeout 0); Patroni requires TTL_S >= LOOP_WAIT_S + 2 * RETRY_TIMEOUT_S."""
LOOP_WAIT_S: Final = 1
RETRY_TIMEOUT_S: Final = 4
READY_S: Final = 120.0
"""A bound on how long bootstrapping (initdb, then a base backup) or a failover may take on a
loaded machine, never an expectation."""
PROBE_S: Final = 0.2


class HaUnavailable(RuntimeError):
    """Patroni or etcd is not installed, or the cluster did not come up (the message says why)."""


def missing() -> str | None:
    """Why this machine cannot run the cluster (`./dev test` installs what it needs), or None."""
    for tool in ("patroni", "etcd"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install patroni etcd-server)"
    if not (PG_BIN / "postgres").exists():
        return f"no PostgreSQL 15 server in {PG_BIN} (apt-get install postgresql-15)"
    return None


@dataclass
class Member:
    """One Postgres server and the Patroni that runs it."""

    name: str
    pg_port: int
    api_port: int
    folder: Path
    process: asyncio.subprocess.Process | None = None

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def postmaster_pid(self) -> int:
        """The running postmaster's pid (the first line of postmaster.pid)."""
        return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])


@dataclass
class HaCluster:
    root: Path
    etcd_port: int
    members: list[Member]
    etcd: asyncio.subprocess.Process | None = None
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    def url(self, database: str = DATABASE) -> str:
        """The multi-host URL (libpq's form, which asyncpg reads): every member, and only a
        session on the primary will do."""
        hosts = ",".join(f"127.0.0.1:{m.pg_port}" for m in self.members)
        credentials = f"{SUPERUSER}:{SUPERUSER_PASSWORD}"
        return f"postgresql://{credentials}@{hosts}/{database}?target_session_attrs=read-write"

    async def roles(self) -> dict[str, str]:
        """Each member's role as Patroni's REST API reports it (`leader`, `sync_standby`,
        `replica`), for the members that are running."""
        for member in self.members:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                cluster = await self._get(member.api + "/cluster")
                return {
                    m["name"]: m["role"]
                    for m in cluster.get("members", [])
                    if m.get("state") in ("running", "streaming")
                }
        return {}

    async def primary(self) -> Member:
        """The current leader, once there is one with a synchronous standby beside it."""
        async with asyncio.timeout(READY_S):
            while True:
                roles = await self.roles()
                leader = [m for m in self.members if roles.get(m.name) == "leader"]
                if leader and "sync_standby" in roles.values():
                    return leader[0]
                await asyncio.sleep(PROBE_S)

    async def kill_primary_postgres(self) -> Member:
        """kill -9 the primary's postmaster (its Patroni lives on and fails over, as
        primary_start_timeout is 0); returns the member that was primary."""
        old = await self.primary()
        os.kill(old.postmaster_pid(), signal.SIGKILL)
        return old

    async def until_new_leader(self, old: Member) -> Member:
        """Another member than `old`, once Patroni has promoted it."""
        async with asyncio.timeout(READY_S):
            while True:
                roles = await self.roles()
                leader = [m for m in self.members if roles.get(m.name) == "leader"]
                if leader and leader[0] is not old:
                    return leader[0]
                await asyncio.sleep(PROBE_S)

    async def until_failed_over(self, old: Member) -> Member:
        """The new primary, once another member than `old` leads and `old` has come back as
        its synchronous standby (so that the next failover loses nothing either)."""
        async with asyncio.timeout(READY_S):
            while True:
                roles = await self.roles()
                leader = [m for m in self.members if roles.get(m.name) == "leader"]
                if leader and leader[0] is not old and roles.get(old.name) == "sync_standby":
                    return leader[0]
                await asyncio.sleep(PROBE_S)

    async def set_paused(self, paused: bool) -> None:
        """Patroni's maintenance mode, on or off, once every member runs with it: while paused,
        Patroni neither restarts a crashed Postgres nor fails over by itself, so an outage
        lasts until `fail_over_to` (a test's outage of a chosen length)."""
        await self._send("PATCH", self.members[0].api + "/config", {"pause": paused})
        async with asyncio.timeout(READY_S):
            while True:
                states = [await self._get(m.api + "/patroni") for m in self.members]
                if all(bool(state.get("pause")) == paused for state in states):
                    return
                await asyncio.sleep(PROBE_S)

    async def fail_over_to(self, candidate: Member) -> Member:
        """Promote `candidate` (the synchronous standby: in synchronous_mode no other may be),
        as `patronictl failover` does, also while paused; once it leads."""
        await self._send("POST", candidate.api + "/failover", {"candidate": candidate.name})
        async with asyncio.timeout(READY_S):
            while True:
                if (await self.roles()).get(candidate.name) == "leader":
                    return candidate
                await asyncio.sleep(PROBE_S)

    async def _get(self, url: str) -> dict[str, Any]:
        async with self._client().get(url) as response:
            body: dict[str, Any] = await response.json(content_type=None)
            return body

    async def _send(self, method: str, url: str, body: dict[str, Any]) -> None:
        async with self._client().request(method, url, json=body) as response:
            if response.status >= 300:
                raise HaUnavailable(f"{method} {url}: {response.status} {await response.text()}")

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        return self._session


def _patroni_config(cluster: HaCluster, member: Member) -> dict[str, Any]:
    loopback = "127.0.0.1/32"
    return {
        "scope": SCOPE,
        "name": member.name,
        "log": {"level": "INFO"},
        "restapi": {
            "listen": f"127.0.0.1:{member.api_port}",
            "connect_address": f"127.0.0.1:{member.api_port}",
        },
        # The v3 API: etcd 3.4 serves v2 only when asked to.
        "etcd3": {"hosts": [f"127.0.0.1:{cluster.etcd_port}"]},
        "bootstrap": {
            "dcs": {
                "ttl": TTL_S,
                "loop_wait": LOOP_WAIT_S,
                "retry_timeout": RETRY_TIMEOUT_S,
                "maximum_lag_on_failover": 1 << 20,
                # A commit is acknowledged once the standby has it too, and only that
                # standby may be promoted: an acknowledged append is never lost.
                "synchronous_mode": True,
                # A crashed primary fails over at once rather than being restarted in place
                # (up to 300s of crash recovery, by default); with a synchronous standby,
                # that loses nothing.
                "primary_start_timeout": 0,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "wal_log_hints": "on",
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                        "max_connections": 200,
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, "data-checksums"],
            "pg_hba": [
                f"host replication {REPLICATION_USER} {loopback} scram-sha-256",
                f"host all all {loopback} scram-sha-256",
                "local all all trust",
            ],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{member.pg_port}",
            "connect_address": f"127.0.0.1:{member.pg_port}",
            "data_dir": str(member.data_dir),
            "bin_dir": str(PG_BIN),
            "pgpass": str(member.folder / "pgpass"),
            "authentication": {
                "superuser": {"username": SUPERUSER, "password": SUPERUSER_PASSWORD},
                "replication": {"username": REPLICATION_USER, "password": REPLICATION_PASSWORD},
            },
            # Sockets in the member's folder: Debian's default (/var/run/postgresql) is
            # another user's, and two servers on one machine need a folder each anyway.
            "parameters": {"unix_socket_directories": str(member.folder)},
        },
    }


async def _spawn(
    argv: list[str], log: Path, user: pwd.struct_passwd | None
) -> asyncio.subprocess.Process:
    with log.open("ab") as output:
        # A process group of its own: a person's Ctrl-C stops `./dev ha` in order (below),
        # never the servers first.
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            process_group=0,
            user=user.pw_uid if user is not None else None,
            group=user.pw_gid if user is not None else None,
            extra_groups=[] if user is not None else None,
            env=os.environ if user is None else {**os.environ, "HOME": user.pw_dir},
        )


async def _stop(process: asyncio.subprocess.Process | None, wait_s: float = 30) -> None:
    """SIGTERM (Patroni then stops its Postgres cleanly), SIGKILL if it outstays `wait_s`."""
    if process is None or process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), wait_s)
    except TimeoutError:
        process.kill()
        await process.wait()


@asynccontextmanager
async def ha_cluster(*, keep: bool = False) -> AsyncIterator[HaCluster]:
    """etcd and two Patroni-run Postgres servers, bootstrapped, with database DATABASE created
    and migrated (`trainyard migrate`'s migrations, as the superuser that owns the schema); all
    stopped (and, unless `keep`, their folder removed) when the block ends."""
    problem = missing()
    if problem is not None:
        raise HaUnavailable(problem)
    user = runs_as()
    # Under /tmp (world-traversable), not a test's tmp_path: Postgres's user must reach it.
    root = Path(tempfile.mkdtemp(prefix="trainyard-ha-"))
    os.chmod(root, 0o755)
    pg0, api0, pg1, api1, etcd_port, peer_port = free_ports(6)
    members = [Member("pg0", pg0, api0, root / "pg0"), Member("pg1", pg1, api1, root / "pg1")]
    cluster = HaCluster(root, etcd_port, members)
    try:
        etcd_data = root / "etcd"
        cluster.etcd = await _spawn(
            [
                *("etcd", "--name", "etcd0", "--data-dir", str(etcd_data)),
                *("--listen-client-urls", f"http://127.0.0.1:{cluster.etcd_port}"),
                *("--advertise-client-urls", f"http://127.0.0.1:{cluster.etcd_port}"),
                *("--listen-peer-urls", f"http://127.0.0.1:{peer_port}"),
                *("--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}"),
                *("--initial-cluster", f"etcd0=http://127.0.0.1:{peer_port}"),
            ],
            root / "etcd.log",
            None,
        )
        for member in members:
            member.folder.mkdir()
            give(member.folder, user)
            config = member.folder / "patroni.yml"
            # JSON is YAML: Patroni reads it as its configuration file.
            config.write_text(json.dumps(_patroni_config(cluster, member), indent=2))
            give(config, user)
            log = member.folder / "patroni.log"
            log.touch()
            give(log, user)
            member.process = await _spawn(["patroni", str(config)], log, user)
        try:
            await cluster.primary()
        except TimeoutError:
            raise HaUnavailable(
                f"no primary with a synchronous standby within {READY_S:.0f}s (logs under {root})"
            ) from None
        await _create_database(cluster)
        yield cluster
    finally:
        # In order: the servers (each Patroni stops its Postgres), then etcd they report to.
        # Shielded: a cancelled test must still leave no server behind.
        await asyncio.shield(_stop_all(cluster))
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


async def _stop_all(cluster: HaCluster) -> None:
    for member in cluster.members:
        await _stop(member.process)
    await _stop(cluster.etcd)
    if cluster._session is not None:
        await cluster._session.close()


async def _create_database(cluster: HaCluster) -> None:
    admin = await connect(cluster.url("postgres"), role=None)
    try:
        await admin.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await admin.close()
    # A commit is acknowledged once the standby has flushed it, not yet replayed it; and a
    # client that tries the standby first (the URL's order) takes "no such database" from it
    # as final rather than trying the next host. Only a new database is exposed to this.
    async with asyncio.timeout(READY_S):
        for member in cluster.members:
            while True:
                if await _has_database(member):
                    break
                await asyncio.sleep(PROBE_S)
    await migrate(cluster.url())


async def _has_database(member: Member) -> bool:
    url = f"postgresql://{SUPERUSER}:{SUPERUSER_PASSWORD}@127.0.0.1:{member.pg_port}/{DATABASE}"
    try:
        conn = await asyncpg.connect(url, timeout=5)
    except asyncpg.InvalidCatalogNameError:
        return False
    await conn.close()
    return True


async def _serve(keep: bool) -> None:
    async with ha_cluster(keep=keep) as cluster:
        primary = await cluster.primary()
        print(
            f"etcd on 127.0.0.1:{cluster.etcd_port}; primary {primary.name}; folder {cluster.root}"
        )
        for member in cluster.members:
            print(f"  {member.name}: postgres 127.0.0.1:{member.pg_port}, patroni {member.api}")
        print(f"export TRAINYARD_DATABASE_URL='{cluster.url()}'")
        await until_interrupted()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m harness.ha",
        description="Run etcd and two Patroni-managed Postgres servers (a primary and a "
        "synchronous standby) on loopback, with Trainyard's database migrated, until Ctrl-C.",
    )
    parser.add_argument("--keep", action="store_true", help="keep the data folder afterwards")
    args = parser.parse_args()
    try:
        asyncio.run(_serve(args.keep))
    except HaUnavailable as exc:
        print(f"ha: error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
