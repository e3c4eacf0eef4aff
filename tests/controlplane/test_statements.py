"""Core statements for asyncpg: a shape compiled once serves every statement of that shape with
its own values, in the order of its placeholders."""

from __future__ import annotations

from sqlalchemy import column, literal, select, table

from controlplane import statements
from controlplane.statements import asyncpg_args

things = table("things", column("name"), column("size"))


def _query(name: str, size: int, limit: int) -> tuple[object, ...]:
    statement = (
        select(things.c.name, literal("tag"))
        .where(things.c.name == name, things.c.size > size)
        .limit(limit)
    )
    return asyncpg_args(statement)


def test_one_shape_is_compiled_once_and_each_statement_keeps_its_values() -> None:
    statements._compiled.clear()
    first = _query("a", 1, 10)
    second = _query("b'); DROP TABLE things; --", 2, 20)
    assert len(statements._compiled) == 1
    assert first[0] == second[0] and "$1" in str(first[0])
    assert first[1:] == ("tag", "a", 1, 10)
    assert second[1:] == ("tag", "b'); DROP TABLE things; --", 2, 20)


def test_the_cache_keeps_the_most_recent_shapes() -> None:
    statements._compiled.clear()
    for n in range(statements.CACHED_SHAPES + 5):
        asyncpg_args(select(*(things.c.name for _ in range(n + 1))))
    assert len(statements._compiled) == statements.CACHED_SHAPES
