"""A job's log feed starts with its first follower and reads where the log stands; that
follower has meanwhile caught up from the database on its own. Lines that commit between the
two reads must still reach it (the dashboard's stream after a control plane restart missed
them: every follower of the new server is the first of its feed)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.http.app import create_app
from controlplane.http.logs import LOG_POLL_S, LOG_SETTLE_S
from controlplane.logs.store import read_lines, write_lines
from tests.controlplane.logs.test_logs import Client, line, sse, submit, take
from tests.tenancy import Tokens, auth


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    app = create_app(db_url, poll_interval=0.2, sse_heartbeat_s=0.2)
    app[LOG_SETTLE_S] = 0.3
    app[LOG_POLL_S] = 0.05
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_lines_stored_while_the_feed_reads_where_the_log_stands_reach_its_first_follower(
    client: Client, tokens: Tokens, pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    job = await submit(client, tokens.acme)
    headers = auth(tokens.acme)
    await write_lines(pool, [line(job, 1)])
    async with owner.transaction():
        # The feed reads the log's head from job_log_heads: held here until the lines below
        # commit, while the follower reads job_logs (its catch-up) freely. This is the
        # interleaving a loaded server gets by chance.
        await owner.execute("LOCK TABLE job_log_heads IN ACCESS EXCLUSIVE MODE")
        response = await client.get(f"/v1/jobs/{job}/logs?follow=true", headers=headers)
        caught_up = await take(response, 1)  # from the database: the feed has read nothing
        await write_lines(owner, [line(job, 2), line(job, 3)])
    # The feed now starts after line 3, which its follower has not read.
    assert (await client.post(f"/v1/jobs/{job}/cancel", headers=headers)).status == 200
    rest = [m async for m in sse(response) if m is not None]

    stored = await read_lines(pool, job)
    assert [s.line.seq for s in stored] == [1, 2, 3]
    assert [m.id for m in caught_up + rest] == [s.id for s in stored] + [None]
    assert rest[-1].data == {"state": "CANCELLED", "last_id": stored[-1].id}
