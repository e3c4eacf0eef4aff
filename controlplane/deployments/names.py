"""The rule for deployment and pipeline names: lowercase, as in stream ids and URLs."""

from __future__ import annotations

import re

from controlplane.deployments.errors import InvalidRequest

NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")
"""No '.': a stream id joins tenant and name with one (streams.py)."""


def check_name(name: str, *, field: str = "name") -> str:
    if not NAME.fullmatch(name):
        raise InvalidRequest(
            f"invalid name {name[:80]!r}: use 1 to 63 lowercase letters, digits and '-', "
            "starting with a letter",
            field=field,
        )
    return name
