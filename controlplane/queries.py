"""The control plane's SQL, loaded by name from `queries.sql`."""

from __future__ import annotations

import re
from importlib.resources import files
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


Q: Final[dict[str, str]] = parse(files("controlplane").joinpath("queries.sql").read_text())
