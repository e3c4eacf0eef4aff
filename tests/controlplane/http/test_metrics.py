"""`GET /v1/jobs/{id}/metrics`: the learners' metric reports, from their stored lines."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.http.app import create_app
from controlplane.http.keys import POOL
from controlplane.logs.lines import LogLine, Stream
from controlplane.logs.store import write_lines
from runners import protocol
from tests.tenancy import Tokens

Client = TestClient[Any, Any]


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(db_url))) as client:
        yield client


async def test_metrics_come_back_in_order_with_their_attempt_and_learner(
    client: Client, tokens: Tokens
) -> None:
    headers = {"Authorization": f"Bearer {tokens.acme}"}
    manifest = {"name": "m", "image": "img", "command": ["train"]}
    job = await (await client.post("/v1/jobs", json=manifest, headers=headers)).json()
    at = datetime.now(UTC)
    reports = [
        protocol.encode(protocol.Metric(step=10, values={"loss": 0.5}, at=at)),
        'an ordinary line mentioning "kind":"metric"',
        protocol.encode(protocol.Metric(step=20, values={"loss": math.inf, "lr": 0.1}, at=at)),
    ]
    lines = [
        LogLine(
            UUID(job["id"]), attempt=1, learner=0, stream=Stream.STDOUT, seq=i + 1, at=at, text=t
        )
        for i, t in enumerate(reports)
    ]
    await write_lines(client.app[POOL], lines)

    body = await (await client.get(f"/v1/jobs/{job['id']}/metrics", headers=headers)).json()
    assert [(m["attempt"], m["learner"], m["step"], m["values"]) for m in body["metrics"]] == [
        (1, 0, 10, {"loss": 0.5}),
        (1, 0, 20, {"loss": "inf", "lr": 0.1}),
    ]
    other = {"Authorization": f"Bearer {tokens.globex}"}
    assert (await client.get(f"/v1/jobs/{job['id']}/metrics", headers=other)).status == 404
