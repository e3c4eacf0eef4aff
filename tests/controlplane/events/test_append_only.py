"""The events table is append-only by privilege (the app role) and by trigger (everyone)."""

from __future__ import annotations

import asyncpg
import pytest

from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from tests.events import Pinged

CHANGES = ["UPDATE events SET type = 'x'", "DELETE FROM events", "TRUNCATE events"]


@pytest.mark.parametrize("statement", CHANGES)
async def test_the_application_role_may_not_change_events(
    store: EventStore, pool: asyncpg.Pool, owner: asyncpg.Connection, statement: str
) -> None:
    await store.append("job-1", 0, [Pinged(n=1)], Metadata(actor="test"))
    assert await pool.fetchval("SELECT current_user") == "trainyard_app"
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
        await pool.execute(statement)
    assert await owner.fetchval("SELECT count(*) FROM events") == 1


@pytest.mark.parametrize("statement", CHANGES)
async def test_the_trigger_refuses_changes_even_for_the_owner(
    store: EventStore, owner: asyncpg.Connection, statement: str
) -> None:
    await store.append("job-1", 0, [Pinged(n=1)], Metadata(actor="test"))
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
        await owner.execute(statement)
    assert await owner.fetchval("SELECT count(*) FROM events") == 1


async def test_the_application_role_holds_exactly_select_and_insert(
    owner: asyncpg.Connection,
) -> None:
    privileges = {
        p: await owner.fetchval("SELECT has_table_privilege('trainyard_app', 'events', $1)", p)
        for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
    }
    assert {p for p, held in privileges.items() if held} == {"SELECT", "INSERT"}
