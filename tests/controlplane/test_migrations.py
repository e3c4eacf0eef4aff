"""Migrations: from empty to exactly the declared schema, once each, under a lock, checksummed."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from controlplane import schema
from controlplane.database import connect
from controlplane.migrate import Migration, MigrationError, available, migrate, pending

CATALOG = """
SELECT c.relname AS table_name, a.attname AS column_name,
       format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null,
       pg_get_expr(d.adbin, d.adrelid) AS default_value, a.attidentity AS identity
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY 1, a.attnum
"""
CONSTRAINTS = """
SELECT c.relname AS table_name, k.contype AS kind, pg_get_constraintdef(k.oid) AS definition
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
ORDER BY 1, 2, 3
"""
INDEXES = """
SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
ORDER BY 1, 2
"""


async def catalog(url: str) -> dict[str, Any]:
    conn = await connect(url, role=None)
    try:
        return {
            "columns": [dict(r) for r in await conn.fetch(CATALOG)],
            "constraints": [dict(r) for r in await conn.fetch(CONSTRAINTS)],
            # Postgres names unnamed primary keys and constraints alike either way; compare
            # index definitions without names only for those it named itself.
            "indexes": [
                (r["tablename"], r["indexdef"].replace(r["indexname"], "<name>"))
                for r in await conn.fetch(INDEXES)
                if r["indexname"] not in schema.SERVER_DEPENDENT_INDEXES
            ],
        }
    finally:
        await conn.close()


async def test_migrating_from_empty_gives_exactly_the_declared_schema(
    empty_db_url: str, db_url: str
) -> None:
    applied = await migrate(empty_db_url)
    assert [m.version for m in applied] == [m.version for m in available()]
    # Build the declaration in another database and compare the two catalogs whole.
    conn = await connect(db_url, role=None)
    try:
        for table in schema.metadata.tables:
            await conn.execute(f"DROP TABLE {table} CASCADE")
        dialect = postgresql.dialect()
        for table in schema.metadata.sorted_tables:
            await conn.execute(str(CreateTable(table).compile(dialect=dialect)))
            for index in table.indexes:
                await conn.execute(str(CreateIndex(index).compile(dialect=dialect)))
    finally:
        await conn.close()
    migrated, declared = await catalog(empty_db_url), await catalog(db_url)
    assert migrated["columns"] == declared["columns"]
    assert migrated["constraints"] == declared["constraints"]
    assert migrated["indexes"] == declared["indexes"]


async def test_migrate_applies_each_migration_once(empty_db_url: str) -> None:
    assert await migrate(empty_db_url)
    assert await migrate(empty_db_url) == []


async def test_concurrent_migrate_runs_are_safe(empty_db_url: str) -> None:
    results = await asyncio.gather(*(migrate(empty_db_url) for _ in range(3)))
    assert sorted(len(r) for r in results) == [0, 0, len(available())]
    conn = await connect(empty_db_url, role=None)
    try:
        rows = await conn.fetch("SELECT version, checksum FROM schema_migrations ORDER BY 1")
    finally:
        await conn.close()
    assert [(r["version"], r["checksum"]) for r in rows] == [
        (m.version, m.checksum) for m in available()
    ]


async def test_an_applied_migration_that_changed_is_a_clear_error(
    db_url: str, owner: asyncpg.Connection
) -> None:
    await owner.execute("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1")
    with pytest.raises(MigrationError, match=r"0001_event_store\.sql was changed"):
        await migrate(db_url)


def test_pending_is_what_is_not_applied_and_refuses_unknown_versions() -> None:
    files = [Migration(1, "a", "SELECT 1"), Migration(2, "b", "SELECT 2")]
    applied = [{"version": 1, "name": "a", "checksum": files[0].checksum}]
    assert pending(files, applied) == [files[1]]  # type: ignore[arg-type]
    newer = [*applied, {"version": 3, "name": "c", "checksum": "x"}]
    with pytest.raises(MigrationError, match="0003_c, which this code does not know"):
        pending(files, newer)  # type: ignore[arg-type]
