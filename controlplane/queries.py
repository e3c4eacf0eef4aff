"""The control plane's SQL, by name: one registry over every feature's named-query file.

Each feature keeps its statements beside its code (`jobs/queries.sql`, `agents/queries.sql`, ...;
a top-level module's next to it, `migrate.sql`). In a file, a block starts with
"-- name: <name>" and its remaining comment lines say what it is for. Names are one namespace
across files, so a name defined twice, in one file or two, fails the import.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Final

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a named-queries file into {name: sql}; text before the first name is a preamble."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip()
    return queries


def sql_files(directory: Traversable, prefix: str = "") -> Iterator[tuple[str, Traversable]]:
    """Every .sql file under `directory`, with its path relative to it, in a stable order."""
    for entry in sorted(directory.iterdir(), key=lambda entry: entry.name):
        path = f"{prefix}{entry.name}"
        if entry.is_dir():
            yield from sql_files(entry, f"{path}/")
        elif entry.name.endswith(".sql"):
            yield path, entry


def load(directory: Traversable) -> dict[str, str]:
    """The queries of every .sql file under `directory`; a name in two files is an error."""
    queries: dict[str, str] = {}
    defined_in: dict[str, str] = {}
    for path, file in sql_files(directory):
        for name, sql in parse(file.read_text()).items():
            if name in defined_in:
                raise ValueError(f"query {name!r} is defined in {defined_in[name]} and in {path}")
            defined_in[name] = path
            queries[name] = sql
    return queries


Q: Final[dict[str, str]] = load(files("controlplane"))
