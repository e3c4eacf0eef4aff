"""The control plane's HTTP surface: health, readiness and an OpenAPI document true to routes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.events.metadata import Metadata
from controlplane.http.app import create_app
from controlplane.http.keys import PROJECTIONS, STORE
from tests.events import Pinged


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[TestClient[object, object]]:
    async with TestClient(TestServer(create_app(db_url, poll_interval=0.1))) as client:
        yield client


async def test_healthz(client: TestClient[object, object]) -> None:
    response = await client.get("/healthz")
    assert response.status == 200
    assert await response.json() == {"status": "ok"}


async def test_readyz_waits_for_projections_to_catch_up(client: TestClient[object, object]) -> None:
    app = client.server.app
    runner = app[PROJECTIONS]
    runner.stop()  # hold projections back to observe "not ready"
    await app[STORE].append("job-1", 0, [Pinged(n=1)], Metadata(actor="test"))
    response = await client.get("/readyz")
    assert response.status == 503
    assert (await response.json())["projections_caught_up"] is False
    for projection in runner.projections.values():
        await runner.catch_up(projection)
    response = await client.get("/readyz")
    assert response.status == 200
    assert await response.json() == {
        "status": "ready",
        "database": True,
        "projections_caught_up": True,
        "background_tasks": True,
    }


async def test_openapi_describes_every_route(client: TestClient[object, object]) -> None:
    document = await (await client.get("/openapi.json")).json()
    routes = {
        (route.resource.canonical, route.method.lower())
        for route in client.server.app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    described = {(path, method) for path, ops in document["paths"].items() for method in ops}
    assert described == routes
    assert {"JobManifest", "Job", "Error"} <= set(document["components"]["schemas"])


async def test_every_openapi_link_leads_to_an_operation_and_fills_its_path(
    client: TestClient[object, object],
) -> None:
    document = await (await client.get("/openapi.json")).json()
    operations = {
        op["operationId"]: (path, op)
        for path, ops in document["paths"].items()
        for op in ops.values()
    }
    assert len(operations) == sum(len(ops) for ops in document["paths"].values())
    links = [
        link
        for ops in document["paths"].values()
        for op in ops.values()
        for response in op["responses"].values()
        for link in response.get("links", {}).values()
    ]
    assert {link["operationId"] for link in links} >= {"getJob", "cancelJob", "getJobLogs"}
    for link in links:
        path, _ = operations[link["operationId"]]
        assert set(link["parameters"]) == {
            name.strip("{}") for name in path.split("/") if "{" in name
        }
