"""Warm uids at once, on Postgres (migration 0047): what the contract suite cannot show one call
at a time. Whatever races an adoption for the same job (another adoption, or the job's first
uid allocated as another agent starts its learners), the job ends with one uid, and what lost
is left as it was."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import asyncpg
import pytest

from controlplane.agent_port.postgres import PostgresPort
from controlplane.agent_port.values import WarmUid
from controlplane.database import AGENT_ROLE, connect
from controlplane.queries import Q
from tests.cluster import Plane
from tests.controlplane.agent_port.conftest import PostgresControl
from tests.controlplane.agent_port.test_contract import manifest, node
from tests.polling import eventually

UIDS = range(9000, 9010)


@pytest.fixture
async def sessions(db_url: str) -> AsyncIterator[tuple[asyncpg.Connection, asyncpg.Connection]]:
    """Two agent sessions, to hold one's transaction open while the other runs into it."""
    first = await connect(db_url, role=AGENT_ROLE)
    second = await connect(db_url, role=AGENT_ROLE)
    yield first, second
    await first.close()
    await second.close()


async def claimed_on_n1(
    plane: Plane, owner: asyncpg.Connection, port: PostgresPort, uids: range | None
) -> UUID:
    """A job claimed by n1, all of it on n1; with a uid of `uids` unless None."""
    await port.register(node("n1", 1), ttl_s=60)
    job_id = await PostgresControl(plane, owner).submit(manifest())
    await port.claim("n1", uids=uids)
    return job_id


async def held(port: PostgresPort) -> WarmUid:
    warm = await port.hold_warm_uid("n1", UIDS)
    assert warm is not None
    return warm


async def waits_on_a_lock(owner: asyncpg.Connection, session: asyncpg.Connection) -> None:
    """Until `session`'s statement waits for a lock another transaction holds."""

    async def waiting() -> bool:
        query = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1"
        return bool(await owner.fetchval(query, session.get_server_pid()) == "Lock")

    await eventually(waiting)


async def uids_of(owner: asyncpg.Connection, job_id: UUID) -> list[int]:
    rows = await owner.fetch("SELECT uid FROM learner_uids WHERE job_id = $1", job_id)
    return [r["uid"] for r in rows]


async def test_two_adoptions_for_one_job_at_once_leave_it_one_uid(
    plane: Plane,
    owner: asyncpg.Connection,
    agent_port: PostgresPort,
    sessions: tuple[asyncpg.Connection, asyncpg.Connection],
) -> None:
    job_id = await claimed_on_n1(plane, owner, agent_port, UIDS)
    claimed = await agent_port.allocate_uid(job_id, UIDS)
    assert claimed is not None
    won, lost = await held(agent_port), await held(agent_port)
    first, second = sessions
    async with first.transaction():
        adopted = await first.fetchval(Q["adopt_warm_uid"], job_id, "n1", won.placeholder, job_id)
        assert adopted == won.uid
        racing = asyncio.create_task(
            second.fetchval(Q["adopt_warm_uid"], job_id, "n1", lost.placeholder, job_id)
        )
        await waits_on_a_lock(owner, second)  # on the claim's uid, which the first gives back
    assert await racing is None
    assert await uids_of(owner, job_id) == [won.uid]
    assert await uids_of(owner, lost.placeholder) == [lost.uid]  # still warm
    assert await agent_port.allocate_uid(uuid4(), range(claimed, claimed + 1)) == claimed
    assert await agent_port.release_warm_uids("n1") == 1


async def test_an_adoption_racing_the_job_s_first_uid_leaves_it_that_one(
    plane: Plane,
    owner: asyncpg.Connection,
    agent_port: PostgresPort,
    sessions: tuple[asyncpg.Connection, asyncpg.Connection],
) -> None:
    # Claimed with no uid (a node that is not root): its learners' node allocates it as they
    # start, and this one commits first.
    job_id = await claimed_on_n1(plane, owner, agent_port, None)
    warm = await held(agent_port)
    allocating, adopting = sessions
    async with allocating.transaction():
        first = await allocating.fetchval(Q["allocate_learner_uid"], job_id, UIDS.start, 10)
        racing = asyncio.create_task(
            adopting.fetchval(Q["adopt_warm_uid"], job_id, "n1", warm.placeholder, job_id)
        )
        await waits_on_a_lock(owner, adopting)  # on the job's uid being inserted
    assert await racing is None
    assert await uids_of(owner, job_id) == [first]
    assert await uids_of(owner, warm.placeholder) == [warm.uid]  # still warm


async def test_the_job_s_first_uid_racing_an_adoption_is_the_adopted_one(
    plane: Plane,
    owner: asyncpg.Connection,
    agent_port: PostgresPort,
    sessions: tuple[asyncpg.Connection, asyncpg.Connection],
) -> None:
    job_id = await claimed_on_n1(plane, owner, agent_port, None)
    warm = await held(agent_port)
    adopting, allocating = sessions
    async with adopting.transaction():
        adopted = await adopting.fetchval(
            Q["adopt_warm_uid"], job_id, "n1", warm.placeholder, job_id
        )
        assert adopted == warm.uid
        racing = asyncio.create_task(
            allocating.fetchval(Q["allocate_learner_uid"], job_id, UIDS.start, 10)
        )
        await waits_on_a_lock(owner, allocating)  # on the job's row the adoption re-keyed
    assert await racing == warm.uid
    assert await uids_of(owner, job_id) == [warm.uid]
    assert await owner.fetchval("SELECT count(*) FROM warm_uids") == 0
