"""The control plane's HTTP surface: health, readiness and an OpenAPI document true to routes."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane import telemetry
from controlplane.database import Executor
from controlplane.events.metadata import Metadata
from controlplane.events.records import RecordedEvent
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.http.app import create_app
from controlplane.http.keys import POOL, PROJECTIONS, STORE
from controlplane.http.params import NO_NUL
from controlplane.projections.runner import MAX_FAILURES, ProjectionRunner
from controlplane.projections.streams import StreamsProjection
from controlplane.queries import Q
from controlplane.tenants.events import TenantCreated
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import create_tenant
from tests.polling import eventually
from tests.tenancy import Tokens


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
    # Projections held back as another control plane holding them would: their locks, taken
    # once a batch under way (the app's own first events woke the runner) has committed.
    async with app[POOL].acquire() as holder, holder.transaction():
        for name in runner.projections:
            await holder.execute(Q["lock_projection_wait"], name)
        created = TenantCreated(at=datetime.now(UTC), name="t", weight=1, gpu_quota=None)
        await app[STORE].append("tenant-t", 0, [created], Metadata(actor="test"))

        # Not ready once the event is readable (a transaction begun before it, elsewhere in
        # the app, holds it back from readers until it ends: the log is gap-free).
        async def behind() -> bool:
            response = await client.get("/readyz")
            body = await response.json()
            return response.status == 503 and body["projections_caught_up"] is False

        await eventually(behind)
    # Let go: ready once caught up (the runner catches up by itself; an event the app appends
    # meanwhile, such as a starting part's first, is waited for as well).
    answers: list[object] = []

    async def ready() -> bool:
        for projection in runner.projections.values():
            await runner.catch_up(projection)
        response = await client.get("/readyz")
        answers.append(await response.json())
        return response.status == 200

    await eventually(ready)
    assert answers[-1] == {
        "status": "ready",
        "database": True,
        "projections_caught_up": True,
        "background_tasks": True,
        "stopped_projections": {},
    }


class Fragile:
    """Fails on the creation of the tenant named "poison", whatever else it is given."""

    name = "fragile"
    tables: Sequence[str] = ()
    categories: frozenset[str] | None = frozenset({"tenant"})

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        for recorded in events:
            if isinstance(recorded.event, TenantCreated) and recorded.event.name == "poison":
                raise RuntimeError("a bug in the fragile projection")


async def test_a_projection_failing_again_and_again_on_one_event_stops_and_says_so(
    db_url: str, pool: asyncpg.Pool, store: EventStore, tokens: Tokens
) -> None:
    telemetry.setup()  # as `trainyard serve` does first: counts before it would be lost
    app = create_app(db_url, poll_interval=0.1, projections=[StreamsProjection(), Fragile()])
    async with TestClient(TestServer(app)) as client:
        runner = app[PROJECTIONS]
        tenants = ProjectionRunner(pool, store, LogListener(db_url), [TenantsProjection()])
        await create_tenant(store, tenants, "poison", actor="test")

        async def stopped() -> bool:
            return "fragile" in runner.stopped()

        await eventually(stopped)
        position = await pool.fetchval(
            "SELECT position FROM events WHERE stream_id = 'tenant-poison' AND stream_version = 1"
        )
        response = await client.get("/readyz")
        assert response.status == 503
        body = await response.json()
        assert body["status"] == "not ready"
        why = body["stopped_projections"]["fragile"]
        assert f"position {position} (TenantCreated" in why
        assert f"{MAX_FAILURES} times in a row" in why
        assert "a bug in the fragile projection" in why
        assert list(body["stopped_projections"]) == ["fragile"]

        # The other projections go on: a later event reaches the streams projection.
        await create_tenant(store, tenants, "later", actor="test")

        async def streams_caught_up() -> bool:
            return await runner.is_caught_up("streams")

        await eventually(streams_caught_up)
        assert not await runner.is_caught_up("fragile")

        admin = {"Authorization": f"Bearer {tokens.admin}"}
        text = await (await client.get("/metrics", headers=admin)).text()
        assert 'trainyard_projections_stopped{projection="fragile"} 1' in text.splitlines()


async def test_openapi_describes_every_route(client: TestClient[object, object]) -> None:
    document = await (await client.get("/openapi.json")).json()
    routes = {
        (route.resource.canonical, route.method.lower())
        for route in client.server.app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    described = {(path, method) for path, ops in document["paths"].items() for method in ops}
    assert described == routes
    assert {"JobManifest", "JobView", "Error"} <= set(document["components"]["schemas"])


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


async def test_every_text_parameter_has_its_rules_in_the_document(
    client: TestClient[object, object],
) -> None:
    """Text parameters are checked for a NUL and a bound (`query.text`, `params.text`): the
    document must say so wherever one is described, or a request it allows is refused
    (schemathesis found a NUL in ?tenant= so, issue 33). Text with a stricter form (an enum, a
    format, a pattern of its own) says that form instead."""
    document = await (await client.get("/openapi.json")).json()
    described = [
        (f"{method.upper()} {path}", parameter["name"], schema)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        for parameter in operation.get("parameters", [])
        if parameter["in"] in ("query", "header")
        for schema in [parameter["schema"].get("items", parameter["schema"])]
        if schema.get("type") == "string"
        and not {"enum", "format", "const", "$ref"} & schema.keys()
    ]
    assert {"tenant", "Idempotency-Key"} <= {name for _, name, _ in described}
    assert len(described) > 10
    for operation, name, schema in described:
        if (operation, name) == ("GET /v1/logs/search", "Last-Event-ID"):
            continue  # read only with follow=true: any text is accepted without it
        if operation == "GET /ui/login/callback":
            continue  # the provider's answer, passed back to it as is (bounds only: ui.py)
        assert "pattern" in schema and not re.search(schema["pattern"], "a\0"), (operation, name)
        if schema["pattern"] == NO_NUL:  # free text: bounded too
            assert "maxLength" in schema, (operation, name)


async def test_the_document_uses_json_schema_keywords_not_pydantic_arguments(
    client: TestClient[object, object],
) -> None:
    """`ge=` and friends in a Field that pydantic could not turn into `minimum` (a validator
    before them) would reach the document as keywords no client reads."""
    text = await (await client.get("/openapi.json")).text()
    for argument in ("ge", "gt", "le", "lt", "min_length", "max_length"):
        assert f'"{argument}":' not in text, argument


async def test_every_event_stream_describes_each_event(client: TestClient[object, object]) -> None:
    """Each SSE response's schema is one event's (its type and JSON data), as tools read it:
    `{"type": "string"}` said every event was text, and each JSON `data` a disagreement."""
    document = await (await client.get("/openapi.json")).json()
    streams = [
        response["content"]["text/event-stream"]["schema"]
        for operations in document["paths"].values()
        for operation in operations.values()
        for response in operation["responses"].values()
        if "text/event-stream" in response.get("content", {})
    ]
    assert len(streams) >= 7
    for schema in streams:
        assert schema["type"] == "object"
        assert {"event", "data"} <= set(schema["required"])
