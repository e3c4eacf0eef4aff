"""Naming the streams of tenants and of the admin token."""

from __future__ import annotations

CATEGORY = "tenant"

ADMIN_STREAM = "system-admin"
"""Holds the bootstrapped admin token; appending at version 0 makes exactly one start win."""


def tenant_stream(name: str) -> str:
    return f"{CATEGORY}-{name}"


def tenant_of(stream_id: str) -> str:
    return stream_id.removeprefix(f"{CATEGORY}-")
