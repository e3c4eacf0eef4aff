"""Commands on a search read it from its stream, not from the read model: a search just
submitted, which the read model does not show yet, can be cancelled and followed at once, and
only by its tenant (schemathesis found a search's cancel link answering 404 while the
projection caught up)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.http.app import create_app
from tests.controlplane.searches.test_search_service import spec
from tests.tenancy import Tokens, auth

Client = TestClient[Any, Any]


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    # No projection runs on this replica: its read model never shows the search, as it does
    # not yet for a moment after every submission.
    async with TestClient(TestServer(create_app(db_url, projections=[]))) as client:
        yield client


async def test_a_search_just_submitted_is_cancelled_by_its_tenant_alone(
    client: Client, tokens: Tokens
) -> None:
    submitted = await client.post("/v1/searches", json=spec(), headers=auth(tokens.acme))
    assert submitted.status == 201, await submitted.text()
    search_id = (await submitted.json())["id"]
    # No projection runs here: the read model never shows it. A read waits for it a while,
    # then says to come back (never "no such search", which its stream would belie).
    shown = await client.get(f"/v1/searches/{search_id}", headers=auth(tokens.acme))
    assert shown.status == 429 and shown.headers["Retry-After"] == "1"

    theirs = await client.post(
        f"/v1/searches/{search_id}/cancel", json={}, headers=auth(tokens.globex)
    )
    assert theirs.status == 404, await theirs.text()
    cancelled = await client.post(
        f"/v1/searches/{search_id}/cancel",
        json={"reason": "wrong space"},
        headers=auth(tokens.acme),
    )
    assert cancelled.status == 200, await cancelled.text()
    assert await cancelled.json() == {"id": search_id, "state": "cancelled"}
