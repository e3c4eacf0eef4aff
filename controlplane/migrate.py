"""Applying the numbered SQL files of `migrations/`, each once, in order, under a lock."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib.resources import files

import asyncpg

from controlplane.database import connect
from controlplane.failures import CommandFailed
from controlplane.queries import Q

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


class MigrationError(CommandFailed):
    """The database's migration history does not match the files; nothing more was applied."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available() -> list[Migration]:
    """The migrations shipped with this code, in version order."""
    found = []
    for entry in files("migrations").iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration files must be numbered 1..n without gaps: {versions}")
    return found


def pending(migrations: list[Migration], applied: list[asyncpg.Record]) -> list[Migration]:
    """The migrations still to apply; an applied one that changed or vanished is an error."""
    known = {m.version: m for m in migrations}
    for row in applied:
        migration = known.get(row["version"])
        if migration is None:
            raise MigrationError(
                f"the database has migration {row['version']:04d}_{row['name']}, which this "
                "code does not know: is it older than the database?"
            )
        if migration.checksum != row["checksum"]:
            raise MigrationError(
                f"migration {migration.version:04d}_{migration.name}.sql was changed after it "
                "was applied (checksum differs); add a new migration instead of editing it"
            )
    done = {row["version"] for row in applied}
    return [m for m in migrations if m.version not in done]


async def migrate(url: str) -> list[Migration]:
    """Bring the database at `url` up to date; returns the migrations it applied."""
    conn = await connect(url, role=None)
    try:
        # A session lock, held across the per-migration transactions: a concurrent `migrate`
        # waits here, then finds everything applied.
        await conn.execute(Q["migrations_lock"])
        try:
            await conn.execute(Q["migrations_table"])
            todo = pending(available(), await conn.fetch(Q["migrations_applied"]))
            for migration in todo:
                async with conn.transaction():
                    await conn.execute(migration.sql)
                    await conn.execute(
                        Q["migration_record"],
                        migration.version,
                        migration.name,
                        migration.checksum,
                    )
            return todo
        finally:
            await conn.execute(Q["migrations_unlock"])
    finally:
        await conn.close()


async def require_migrated(url: str) -> None:
    """Refuse to run against a database that is behind (or ahead of) this code's migrations."""
    conn = await connect(url, role=None)
    try:
        exists = await conn.fetchval(Q["migrations_table_exists"])
        applied = await conn.fetch(Q["migrations_applied"]) if exists else []
    finally:
        await conn.close()
    todo = pending(available(), applied)
    if todo:
        raise MigrationError(
            f"the database lacks {len(todo)} migration(s), from "
            f"{todo[0].version:04d}_{todo[0].name}: run `trainyard migrate` first"
        )
