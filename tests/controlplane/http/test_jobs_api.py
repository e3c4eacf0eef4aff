"""The jobs API through a real HTTP server on a real Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import Nodes, NodeSpec
from controlplane.http.app import create_app
from controlplane.http.keys import POOL, PROJECTIONS, STORE
from tests.tenancy import Tokens

Client = TestClient[Any, Any]

MANIFEST: dict[str, Any] = {
    "name": "mnist",
    "image": "trainyard-learner:latest",
    "command": ["python", "train.py"],
    "framework": "pytorch",
    "gpus_per_learner": 1,
    "labels": {"team": "vision"},
}


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    app = create_app(db_url, poll_interval=0.2, sse_heartbeat_s=0.2)
    async with TestClient(TestServer(app)) as client:
        yield client


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def submit(client: Client, token: str, **changes: Any) -> dict[str, Any]:
    response = await client.post("/v1/jobs", json={**MANIFEST, **changes}, headers=auth(token))
    assert response.status == 201, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def projected(client: Client) -> None:
    """Wait for the server's own projection runner to catch up (lists read projections)."""
    for _ in range(250):
        if await client.app[PROJECTIONS].caught_up():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("projections did not catch up")


async def event_count(owner: asyncpg.Connection) -> int:
    return int(await owner.fetchval("SELECT count(*) FROM events WHERE stream_id LIKE 'job-%'"))


async def test_submit_get_list_cancel(client: Client, tokens: Tokens) -> None:
    acme = tokens.acme
    response = await client.post("/v1/jobs", json=MANIFEST, headers=auth(acme))
    assert response.status == 201
    job = await response.json()
    assert response.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert (job["state"], job["attempt"], job["tenant"]) == ("QUEUED", 1, "acme")
    assert job["manifest"]["name"] == "mnist"

    got = await (await client.get(f"/v1/jobs/{job['id']}", headers=auth(acme))).json()
    assert got == job
    # The OpenAPI document describes exactly what is sent.
    view = (await (await client.get("/openapi.json")).json())["components"]["schemas"]["JobView"]
    assert set(job) == set(view["properties"])
    assert set(view["required"]) <= set(job)

    await projected(client)
    listed = await (await client.get("/v1/jobs", headers=auth(acme))).json()
    assert [j["id"] for j in listed["jobs"]] == [job["id"]]

    cancelled = await client.post(
        f"/v1/jobs/{job['id']}/cancel", json={"reason": "wrong data"}, headers=auth(acme)
    )
    assert cancelled.status == 200
    assert (await cancelled.json())["state"] == "CANCELLED"
    again = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(acme))
    assert again.status == 409
    assert "CANCELLED" in (await again.json())["error"]

    history = (
        await (await client.get(f"/v1/jobs/{job['id']}/history", headers=auth(acme))).json()
    )["history"]
    assert [(h["event"], h["state"], h["actor"], h["reason"]) for h in history] == [
        ("JobSubmitted", "QUEUED", "tenant:acme", None),
        ("JobCancelled", "CANCELLED", "tenant:acme", "wrong data"),
    ]


async def test_bad_input_gets_clear_errors_and_writes_nothing(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    acme = tokens.acme
    job = await submit(client, acme)
    before = await event_count(owner)

    malformed = await client.post(
        "/v1/jobs", data="{not json", headers={**auth(acme), "Content-Type": "application/json"}
    )
    assert malformed.status == 400
    assert "malformed JSON" in (await malformed.json())["error"]

    invalid = await client.post(
        "/v1/jobs",
        json={**MANIFEST, "learners": 0, "colour": "red", "command": []},
        headers=auth(acme),
    )
    assert invalid.status == 422
    fields = {f["field"] for f in (await invalid.json())["fields"]}
    assert fields == {"learners", "colour", "command"}

    assert (await client.get("/v1/jobs/" + "0" * 32, headers=auth(acme))).status == 404
    assert (await client.get("/v1/jobs/not-a-uuid", headers=auth(acme))).status == 404
    assert (await client.post("/v1/jobs", json=MANIFEST)).status == 401
    wrong = await client.post("/v1/jobs", json=MANIFEST, headers=auth("ty_wrong"))
    assert wrong.status == 401
    assert (
        await client.get(f"/v1/jobs/{job['id']}?as_of=yesterday", headers=auth(acme))
    ).status == 400
    assert (await client.get("/v1/jobs?state=RUNNINGISH", headers=auth(acme))).status == 400
    not_utf8 = await client.post(
        "/v1/jobs",
        data=b'{"name": "\xff"}',
        headers={**auth(acme), "Content-Type": "application/json"},
    )
    assert not_utf8.status == 400
    nul = await client.post(
        f"/v1/jobs/{job['id']}/cancel", json={"reason": "a\u0000b"}, headers=auth(acme)
    )
    assert nul.status == 422
    nobody = await client.post(
        "/v1/jobs", params={"tenant": "nobody"}, json=MANIFEST, headers=auth(tokens.admin)
    )
    assert nobody.status == 422
    assert "no tenant named 'nobody'" in (await nobody.json())["error"]
    checkpoint = await client.post(f"/v1/jobs/{job['id']}/checkpoint", headers=auth(acme))
    assert checkpoint.status == 409  # only a PROCESSING job can checkpoint
    assert await event_count(owner) == before


async def test_tenants_see_only_their_own_jobs(client: Client, tokens: Tokens) -> None:
    mine = await submit(client, tokens.acme)
    theirs = await submit(client, tokens.globex, name="other")
    for path in ("", "/history", "/events"):
        response = await client.get(f"/v1/jobs/{theirs['id']}{path}", headers=auth(tokens.acme))
        assert response.status == 404, path
    stolen = await client.post(f"/v1/jobs/{theirs['id']}/cancel", headers=auth(tokens.acme))
    assert stolen.status == 404
    await projected(client)
    listed = await (await client.get("/v1/jobs", headers=auth(tokens.acme))).json()
    assert [j["id"] for j in listed["jobs"]] == [mine["id"]]
    everything = await (await client.get("/v1/jobs", headers=auth(tokens.admin))).json()
    assert {j["id"] for j in everything["jobs"]} == {mine["id"], theirs["id"]}
    seen = await client.get(f"/v1/jobs/{theirs['id']}", headers=auth(tokens.admin))
    assert seen.status == 200


async def test_idempotent_submission_under_concurrent_retries_yields_one_job(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    headers = {**auth(tokens.acme), "Idempotency-Key": "submit-42"}
    responses = await asyncio.gather(
        *(client.post("/v1/jobs", json=MANIFEST, headers=headers) for _ in range(10))
    )
    assert {r.status for r in responses} == {201}
    ids = {(await r.json())["id"] for r in responses}
    assert len(ids) == 1
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in responses) == 9
    assert await event_count(owner) == 1
    changed = await client.post("/v1/jobs", json={**MANIFEST, "name": "x"}, headers=headers)
    assert changed.status == 409
    # The same key from another tenant is another job.
    other = await client.post(
        "/v1/jobs", json=MANIFEST, headers={**auth(tokens.globex), "Idempotency-Key": "submit-42"}
    )
    assert (await other.json())["id"] not in ids


async def test_list_filters_and_pages_without_gaps_or_repeats(
    client: Client, tokens: Tokens
) -> None:
    submitted = [await submit(client, tokens.acme, name=f"job{i}") for i in range(7)]
    await client.post(f"/v1/jobs/{submitted[0]['id']}/cancel", headers=auth(tokens.acme))
    await submit(client, tokens.acme, name="nolabel", labels={"team": "nlp", "size": "xl"})
    await projected(client)

    seen: list[str] = []
    cursor = None
    while True:
        query = "/v1/jobs?label=team=vision&limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = await (await client.get(query, headers=auth(tokens.acme))).json()
        seen.extend(j["id"] for j in page["jobs"])
        assert page["total"] == len(submitted)  # on every page: all that match
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [j["id"] for j in reversed(submitted)]  # newest first, each once
    cancelled = await (
        await client.get("/v1/jobs?state=CANCELLED", headers=auth(tokens.acme))
    ).json()
    assert [j["id"] for j in cancelled["jobs"]] == [submitted[0]["id"]]
    assert cancelled["total"] == 1
    # The admin's total is everyone's; two labels are counted job by job, to the same meaning.
    for token, query, total in [
        (tokens.globex, "/v1/jobs", 0),
        (tokens.admin, "/v1/jobs?state=QUEUED", 7),
        (tokens.acme, "/v1/jobs?label=team=nlp&label=size=xl", 1),
        (tokens.acme, "/v1/jobs?label=team=vision&label=size=xl", 0),
    ]:
        listed = await (await client.get(query, headers=auth(token))).json()
        assert (listed["total"], len(listed["jobs"])) == (total, total), query


async def test_state_as_of_a_past_instant(client: Client, tokens: Tokens) -> None:
    before = datetime.now(UTC)
    job = await submit(client, tokens.acme)
    await asyncio.sleep(0.05)
    between = datetime.now(UTC)
    await asyncio.sleep(0.05)
    await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(tokens.acme))

    async def state_at(instant: datetime) -> tuple[int, str | None]:
        response = await client.get(
            f"/v1/jobs/{job['id']}",
            params={"as_of": instant.isoformat()},
            headers=auth(tokens.acme),
        )
        return response.status, (await response.json()).get("state")

    assert await state_at(before) == (404, None)
    assert await state_at(between) == (200, "QUEUED")
    assert await state_at(datetime.now(UTC)) == (200, "CANCELLED")


async def test_a_job_that_could_never_fit_says_why(client: Client, tokens: Tokens) -> None:
    alone = await submit(client, tokens.acme, gpus_per_learner=4)
    assert alone["unschedulable_reason"] is None  # no node yet: nothing to judge against
    gpus = [
        GpuInfo(index=i, uuid=f"GPU-n1-{i}", model="fake", memory_mb=80_000, healthy=True)
        for i in range(2)
    ]
    nodes = Nodes(client.app[POOL], client.app[STORE])
    await nodes.register(NodeSpec("n1", uuid4(), "process", 8, 65536, gpus), ttl_s=60)
    too_big = await submit(client, tokens.acme, gpus_per_learner=2, learners=2)
    assert too_big["state"] == "QUEUED"  # accepted, never silently stuck
    assert too_big["unschedulable_reason"] == (
        "needs 4 healthy GPU(s) in all; the live nodes have 2"
    )
    too_wide = await submit(client, tokens.acme, gpus_per_learner=3)
    assert too_wide["unschedulable_reason"] == (
        "needs 3 healthy GPU(s) on one node; the largest node has 2"
    )
    fits = await submit(client, tokens.acme, gpus_per_learner=1, learners=2)
    assert fits["unschedulable_reason"] is None
    # Both learners on one node fit n1; asked for two on each of one node, so does this.
    paired = await submit(client, tokens.acme, gpus_per_learner=1, learners=2, learners_per_node=2)
    assert paired["unschedulable_reason"] is None
    too_many_a_node = await submit(
        client, tokens.acme, gpus_per_learner=1, learners=3, learners_per_node=3
    )
    assert too_many_a_node["unschedulable_reason"] == (
        "needs 3 healthy GPU(s) for its 3 learners on each node; the largest node has 2"
    )
    too_few_nodes = await submit(client, tokens.acme, learners=2, learners_per_node=1)
    assert too_few_nodes["unschedulable_reason"] == (
        "needs 2 nodes (1 of its 2 learners on each); the live nodes are 1"
    )
    refused = await client.post(
        "/v1/jobs",
        json={**MANIFEST, "learners": 4, "learners_per_node": 3},
        headers=auth(tokens.acme),
    )
    assert refused.status == 422
    assert "learners_per_node" in await refused.text()
    shown = await (await client.get(f"/v1/jobs/{alone['id']}", headers=auth(tokens.acme))).json()
    assert "largest node has 2" in shown["unschedulable_reason"]
