"""A request that meets the database gone is answered 503 with Retry-After (nothing was changed,
a retry is safe), never a 500; a handler's own error stays what it is."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.database import DatabaseUnavailable
from controlplane.http.outage import outage_middleware

Client = TestClient[web.Request, web.Application]
LOST: dict[str, BaseException] = {
    "closed": asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"),
    "refused": ConnectionRefusedError(111, "Connection refused"),
    "demoted": asyncpg.exceptions.ReadOnlySQLTransactionError("read-only transaction"),
    "no-primary": DatabaseUnavailable("no host took the connection"),
    "shutdown": asyncpg.exceptions.AdminShutdownError("terminating connection"),
}


async def meets(request: web.Request) -> web.Response:
    raise LOST[request.match_info["what"]]


async def fails(request: web.Request) -> web.Response:
    raise ValueError("a handler's own bug")


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    app = web.Application(middlewares=[outage_middleware])
    app.router.add_get("/lost/{what}", meets)
    app.router.add_get("/bug", fails)
    async with TestClient(TestServer(app)) as client:
        yield client


@pytest.mark.parametrize("what", sorted(LOST))
async def test_a_lost_database_is_503_with_retry_after(client: Client, what: str) -> None:
    response = await client.get(f"/lost/{what}")
    assert response.status == 503
    assert response.headers["Retry-After"] == "2"
    body = await response.json()
    assert body["status"] == 503 and "retry" in body["error"]


async def test_a_handlers_own_error_is_not_taken_for_an_outage(client: Client) -> None:
    assert (await client.get("/bug")).status == 500
