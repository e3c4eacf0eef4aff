"""SQLAlchemy Core statements run on asyncpg: the SQL text ($1, $2, ...) and the values in
order, for a pool or connection's `fetch`.

Compiling a statement costs milliseconds of Python, as much as the query it runs; its text
depends only on its shape (which columns, operators and nesting), not its values. So each
shape is compiled once, under SQLAlchemy's own cache key (what its engines cache by), and a
statement of a known shape only has its values taken out: microseconds.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

CACHED_SHAPES = 512
"""Compiled shapes kept (the least recently used go first): searches have few shapes, but a
hostile caller could make many."""

_DIALECT = asyncpg_dialect()  # type: ignore[no-untyped-call]
_compiled: OrderedDict[Any, SQLCompiler] = OrderedDict()


def asyncpg_args(statement: ClauseElement) -> tuple[Any, ...]:
    """`statement` as asyncpg takes it: its SQL, then its values in order."""
    key = statement._generate_cache_key()
    if key is None:  # an element SQLAlchemy cannot cache: compiled every time
        compiled = _compile(statement)
        values = compiled.construct_params()
    else:
        compiled = _compiled.pop(key.key) if key.key in _compiled else _compile(statement, key)
        _compiled[key.key] = compiled
        if len(_compiled) > CACHED_SHAPES:
            _compiled.popitem(last=False)
        values = compiled.construct_params(extracted_parameters=key.bindparams)
    return (compiled.string, *(values[name] for name in compiled.positiontup or ()))


def _compile(statement: ClauseElement, key: Any = None) -> SQLCompiler:
    compiled = statement.compile(dialect=_DIALECT, cache_key=key)
    if not isinstance(compiled, SQLCompiler):
        raise TypeError(f"not a SQL statement: {type(statement).__name__}")
    return compiled
