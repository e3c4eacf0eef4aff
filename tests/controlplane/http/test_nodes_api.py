"""`POST /v1/nodes/{node}/drain` and `/undrain` (admin only) on a real Postgres: the node's flag
and the event that records who set it, what `GET /v1/nodes` shows, and the claim that then
places nothing on the node. How its agent follows a drain: tests/node_agent/test_drain.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import uuid4

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.agents.claims import claim
from controlplane.agents.events import GpuInfo, NodeDrained, NodeUndrained
from controlplane.agents.nodes import Nodes, NodeSpec, node_stream
from controlplane.http.app import create_app
from controlplane.http.keys import POOL, STORE
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.service import Jobs
from tests.cluster import USER
from tests.polling import eventually
from tests.tenancy import Tokens, auth, event_count

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(db_url, poll_interval=0.2))) as client:
        gpus = [GpuInfo(index=0, uuid="GPU-n1-0", model="fake", memory_mb=1024, healthy=True)]
        spec = NodeSpec("n1", uuid4(), "process", 4, 8192, gpus)
        await Nodes(client.app[POOL], client.app[STORE]).register(spec, ttl_s=60)
        yield client


async def test_the_admin_drains_a_node_once_and_puts_it_back(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    admin = auth(tokens.admin)
    before = await event_count(owner)
    drained = await client.post(
        "/v1/nodes/n1/drain", json={"reason": "kernel upgrade"}, headers=admin
    )
    assert drained.status == 200
    body = await drained.json()
    assert (body["name"], body["state"], body["draining"]) == ("n1", "READY", True)
    listed = await (await client.get("/v1/nodes", headers=auth(tokens.acme))).json()
    assert [(n["name"], n["draining"]) for n in listed["nodes"]] == [("n1", True)]

    # Idempotent: drained again, nothing more is written.
    again = await client.post("/v1/nodes/n1/drain", headers=admin)
    assert again.status == 200 and (await again.json())["draining"] is True
    assert await event_count(owner) == before + 1
    events = [r.event for r in await client.app[STORE].read_stream(node_stream("n1"))]
    assert isinstance(events[-1], NodeDrained)
    assert (events[-1].actor, events[-1].reason) == ("admin", "kernel upgrade")
    actor = await owner.fetchval(
        "SELECT metadata ->> 'actor' FROM events WHERE type = 'NodeDrained'"
    )
    assert actor == "admin"

    undrained = await client.post("/v1/nodes/n1/undrain", headers=admin)
    assert undrained.status == 200 and (await undrained.json())["draining"] is False
    assert (await client.post("/v1/nodes/n1/undrain", headers=admin)).status == 200
    events = [r.event for r in await client.app[STORE].read_stream(node_stream("n1"))]
    assert isinstance(events[-1], NodeUndrained) and events[-1].actor == "admin"
    assert await event_count(owner) == before + 2
    # The auditor's record of both commands, with the node each named.
    actions = await owner.fetch(
        "SELECT action, actor, node, reason FROM audit.actions"
        " WHERE action LIKE 'node_%' ORDER BY position"
    )
    assert [tuple(a) for a in actions] == [
        ("node_drain", "admin", "n1", "kernel upgrade"),
        ("node_undrain", "admin", "n1", None),
    ]


async def test_a_drained_node_is_given_no_work(client: Client, tokens: Tokens) -> None:
    pool, store = client.app[POOL], client.app[STORE]
    manifest = JobManifest.model_validate(
        {"name": "t", "image": "img", "command": ["train"], "gpus_per_learner": 1}
    )
    job, _ = await Jobs(store).submit("acme", manifest, USER)

    async def queued() -> bool:
        found = await pool.fetchval("SELECT count(*) FROM job_status WHERE job_id = $1", job.job_id)
        return bool(found)

    await eventually(queued)
    assert (await client.post("/v1/nodes/n1/drain", headers=auth(tokens.admin))).status == 200
    assert await claim(pool, store, "n1") == []
    assert (await client.post("/v1/nodes/n1/undrain", headers=auth(tokens.admin))).status == 200
    [won] = await claim(pool, store, "n1")
    assert won.job.job_id == job.job_id


async def test_only_the_admin_drains_and_an_unknown_node_is_not_found(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    before = await event_count(owner)
    for path in ("/v1/nodes/n1/drain", "/v1/nodes/n1/undrain"):
        refused = await client.post(path, json={"reason": 5}, headers=auth(tokens.acme))
        assert refused.status == 403, path
        assert "only the admin token" in (await refused.json())["error"]
        assert (await client.post(path)).status == 401
    for path in ("/v1/nodes/nowhere/drain", "/v1/nodes/nowhere/undrain"):
        missing = await client.post(path, headers=auth(tokens.admin))
        assert missing.status == 404, path
        assert (await missing.json())["error"] == "no node named 'nowhere'"
    invalid = await client.post(
        "/v1/nodes/n1/drain", json={"reason": 5}, headers=auth(tokens.admin)
    )
    assert invalid.status == 422
    assert await event_count(owner) == before
    listed = await (await client.get("/v1/nodes", headers=auth(tokens.admin))).json()
    assert [n["draining"] for n in listed["nodes"]] == [False]


async def test_drain_and_undrain_are_in_the_openapi_document(client: Client) -> None:
    paths = (await (await client.get("/openapi.json")).json())["paths"]
    for action in ("drain", "undrain"):
        operation = paths[f"/v1/nodes/{{node}}/{action}"]["post"]
        assert {"200", "401", "403", "404"} <= set(operation["responses"]), action
