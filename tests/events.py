"""Event types used only by the tests, and the registry the tests' stores use."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from controlplane.event_registry import EVENT_TYPES
from controlplane.events.types import Event, EventRegistry, event_type


def _split_name(data: dict[str, Any]) -> dict[str, Any]:
    first, _, last = data.pop("name").partition(" ")
    return {**data, "first": first, "last": last}


@event_type("test.Pinged")
class Pinged(Event):
    n: int
    note: str = ""


@event_type("test.Renamed", version=2, upcasters={1: _split_name})
class Renamed(Event):
    """Version 1 had `name`; version 2 split it into `first` and `last`."""

    first: str
    last: str


class Unregistered(Event):
    n: int


TEST_REGISTRY = EventRegistry((*EVENT_TYPES, Pinged, Renamed))
"""Trainyard's event types and the tests' own."""


@contextlib.asynccontextmanager
async def holding_an_xid(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """A transaction that holds an xid and appends nothing, as a lease's renewal or a log write
    does: events committed meanwhile wait behind it, and its commit notifies no reader."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_current_xact_id()")
        yield
