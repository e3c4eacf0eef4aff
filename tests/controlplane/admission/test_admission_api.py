"""Every command that takes room asks the one admission policy first, against the limits the
admin set for its tenant: jobs' CPUs, deployments and their replicas, searches, queued
predictions and artifact bytes. A refusal is a 429 (or 403 when it could never fit) naming the
limit, and writes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.http.app import create_app
from tests.controlplane.deployments.serving import publish
from tests.controlplane.searches.test_search_service import spec
from tests.polling import eventually
from tests.tenancy import Tokens, auth, event_count

Client = TestClient[web.Request, web.Application]
MANIFEST = {"name": "m", "image": "i", "command": ["python", "train.py"]}


@pytest.fixture
async def client(db_url: str, tmp_path: Path) -> AsyncIterator[Client]:
    app = create_app(db_url, poll_interval=0.2, artifacts=FileArtifactStore(tmp_path / "a"))
    async with TestClient(TestServer(app)) as client:
        yield client


async def set_limits(client: Client, tokens: Tokens, **limits: Any) -> None:
    response = await client.put("/v1/tenants/acme/limits", json=limits, headers=auth(tokens.admin))
    assert response.status == 200, await response.text()


async def refused(owner: asyncpg.Connection, call: Any, status: int, field: str) -> dict[str, Any]:
    """`call`'s answer, which must be `status` naming `field`, having written nothing."""
    before = await event_count(owner)
    response = await call
    body: dict[str, Any] = await response.json()
    assert (response.status, body.get("field")) == (status, field), body
    assert await event_count(owner) == before
    return body


async def test_jobs_are_held_to_the_cpus_and_memory_their_tenant_may_ask_for(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await set_limits(client, tokens, cpus=4, memory_mb=10_000)
    acme = auth(tokens.acme)
    job = {**MANIFEST, "learners": 2, "cpus": 1.5, "memory_mb": 1000}
    assert (await client.post("/v1/jobs", json=job, headers=acme)).status == 201

    async def counted() -> bool:
        return await pool.fetchval("SELECT count(*) FROM job_status WHERE tenant = 'acme'") == 1

    await eventually(counted)
    body = await refused(owner, client.post("/v1/jobs", json=job, headers=acme), 429, "cpus")
    assert "holds 3 CPUs" in body["error"] and "3 more" in body["error"]
    huge = {**MANIFEST, "learners": 2, "cpus": 0.5, "memory_mb": 6000}
    await refused(owner, client.post("/v1/jobs", json=huge, headers=acme), 403, "memory_mb")
    # Another tenant's room is its own.
    assert (await client.post("/v1/jobs", json=job, headers=auth(tokens.globex))).status == 201


async def test_deployments_and_replicas_are_held_to_their_limits(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await set_limits(client, tokens, deployments=1, replicas=2)
    acme = auth(tokens.acme)
    await publish(client, tokens.acme, "m", b"weights", "model:predict")
    deploy = {"name": "d1", "model": "m", "replicas": 2}
    assert (await client.post("/v1/deployments", json=deploy, headers=acme)).status == 201

    async def counted() -> bool:
        return await pool.fetchval("SELECT count(*) FROM deployments WHERE tenant = 'acme'") == 1

    await eventually(counted)
    again = {"name": "d2", "model": "m", "replicas": 0}
    await refused(
        owner, client.post("/v1/deployments", json=again, headers=acme), 429, "deployments"
    )
    await refused(
        owner,
        client.patch("/v1/deployments/d1", json={"replicas": 3}, headers=acme),
        429,
        "replicas",
    )
    # Fewer replicas take no room: always admitted.
    scaled = await client.patch("/v1/deployments/d1", json={"replicas": 1}, headers=acme)
    assert scaled.status == 200, await scaled.text()


async def test_an_autoscaled_deployment_holds_the_most_replicas_it_may_grow_to(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await set_limits(client, tokens, replicas=4)
    acme = auth(tokens.acme)
    await publish(client, tokens.acme, "m", b"weights", "model:predict")
    autoscaling = {"min_replicas": 0, "max_replicas": 3}
    first = {"name": "d1", "model": "m", "autoscaling": autoscaling}
    assert (await client.post("/v1/deployments", json=first, headers=acme)).status == 201

    async def counted() -> bool:
        return await pool.fetchval("SELECT count(*) FROM deployments WHERE tenant = 'acme'") == 1

    await eventually(counted)
    # At zero now, it may grow to 3: a second of up to 2 would let the load pass the limit.
    second = {"name": "d2", "model": "m", "autoscaling": {**autoscaling, "max_replicas": 2}}
    await refused(owner, client.post("/v1/deployments", json=second, headers=acme), 429, "replicas")
    fixed = {"name": "d2", "model": "m", "replicas": 1}
    assert (await client.post("/v1/deployments", json=fixed, headers=acme)).status == 201

    async def both() -> bool:
        return await pool.fetchval("SELECT count(*) FROM deployments WHERE tenant = 'acme'") == 2

    await eventually(both)
    # Raising its bounds asks for the difference; lowering them, for nothing.
    path = "/v1/deployments/d1/autoscaling"
    wider = {**autoscaling, "max_replicas": 4}
    await refused(owner, client.put(path, json=wider, headers=acme), 429, "replicas")
    narrower = {**autoscaling, "max_replicas": 2}
    assert (await client.put(path, json=narrower, headers=acme)).status == 200


async def test_jobs_cannot_take_the_room_an_autoscaled_deployment_may_grow_into(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await set_limits(client, tokens, cpus=4, memory_mb=10_000)
    acme = auth(tokens.acme)
    await publish(client, tokens.acme, "m", b"weights", "model:predict")
    deploy = {
        "name": "d",
        "model": "m",
        "resources": {"cpus": 1, "memory_mb": 1000},
        "autoscaling": {"min_replicas": 0, "max_replicas": 2},
    }
    assert (await client.post("/v1/deployments", json=deploy, headers=acme)).status == 201

    async def counted() -> bool:
        return await pool.fetchval("SELECT count(*) FROM deployments WHERE tenant = 'acme'") == 1

    await eventually(counted)
    # No replica runs, but its load may start two: 2 CPUs are its.
    job = {**MANIFEST, "cpus": 3, "memory_mb": 1000}
    await refused(owner, client.post("/v1/jobs", json=job, headers=acme), 429, "cpus")
    fits = {**MANIFEST, "cpus": 2, "memory_mb": 1000}
    assert (await client.post("/v1/jobs", json=fits, headers=acme)).status == 201


async def test_queued_predictions_are_held_to_their_limit(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    await set_limits(client, tokens, queued_predictions=3)
    acme = auth(tokens.acme)
    await publish(client, tokens.acme, "m", b"weights", "model:predict")
    deploy = {"name": "d", "model": "m", "replicas": 0}  # nothing runs: tasks stay queued
    assert (await client.post("/v1/deployments", json=deploy, headers=acme)).status == 201
    path = "/v1/deployments/d/predict"
    queued = await client.post(path, json={"inputs": [1, 2], "async": True}, headers=acme)
    assert queued.status == 202, await queued.text()
    call = client.post(path, json={"inputs": [3, 4], "async": True}, headers=acme)
    body = await refused(owner, call, 429, "queued_predictions")
    assert "holds 2 prediction items" in body["error"]
    too_many = client.post(path, json={"inputs": [1, 2, 3, 4], "async": True}, headers=acme)
    await refused(owner, too_many, 403, "queued_predictions")
    one = await client.post(path, json={"inputs": [5], "async": True}, headers=acme)
    assert one.status == 202


async def test_artifacts_stop_at_the_bytes_their_tenant_may_store(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await set_limits(client, tokens, artifact_bytes=100)
    await publish(client, tokens.acme, "m", b"a" * 60, "model:predict")

    async def stored() -> bool:
        return await pool.fetchval("SELECT count(*) FROM model_versions") == 1

    await eventually(stored)
    before = await event_count(owner)
    with pytest.raises(AssertionError, match="artifact_bytes"):
        await publish(client, tokens.acme, "m", b"b" * 60, "model:predict")
    assert await event_count(owner) == before
    await publish(client, tokens.acme, "m", b"c" * 40, "model:predict")
    await set_limits(client, tokens, artifact_bytes=0)
    with pytest.raises(AssertionError, match="403"):
        await publish(client, tokens.acme, "n", b"d", "model:predict")


async def test_running_searches_are_held_to_their_limit(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await set_limits(client, tokens, searches=1)
    acme = auth(tokens.acme)
    assert (await client.post("/v1/searches", json=spec(), headers=acme)).status == 201

    async def running() -> bool:
        return await pool.fetchval("SELECT count(*) FROM searches WHERE state = 'running'") == 1

    await eventually(running)
    second = client.post("/v1/searches", json=spec(name="again"), headers=acme)
    await refused(owner, second, 429, "searches")
