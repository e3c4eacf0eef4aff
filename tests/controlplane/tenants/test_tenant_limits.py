"""Tenant limits: the admin sets them (HTTP and CLI), submissions are held to them (rate,
queued jobs, the largest node's memory, the manifest's sizes) and carry the job limits, one
checkpoint request is pending at a time; every refusal is a clear 429/422/409 that writes
nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.agents.nodes import Nodes, NodeSpec
from controlplane.clock import SYSTEM_CLOCK
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.http.app import create_app
from controlplane.http.keys import JOBS
from controlplane.http.streams import MAX_STREAMS_ENV, max_streams_from_env
from controlplane.jobs.lifecycle import Deploy, EnterPhase, JobStatus, SaveCheckpoint
from controlplane.jobs.limits import DEFAULT_LOG_LINES
from controlplane.tenants.limits import DEFAULT_STREAMS, TenantLimits
from tests.polling import eventually
from tests.tenancy import Cli, Tokens, auth, event_count

Client = TestClient[web.Request, web.Application]
MANIFEST = {"name": "m", "image": "i", "command": ["python", "train.py"]}


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(db_url, poll_interval=0.2))) as client:
        yield client


async def set_limits(client: Client, tokens: Tokens, **limits: Any) -> Any:
    response = await client.put("/v1/tenants/acme/limits", json=limits, headers=auth(tokens.admin))
    assert response.status == 200, await response.text()
    return await response.json()


async def test_the_admin_sets_some_limits_and_the_others_stay(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    admin = auth(tokens.admin)
    defaults = await (await client.get("/v1/tenants/acme/limits", headers=admin)).json()
    assert defaults == TenantLimits().model_dump(mode="json")
    assert defaults["streams"] == DEFAULT_STREAMS
    assert defaults["log_lines"] == DEFAULT_LOG_LINES

    assert (await set_limits(client, tokens, streams=3))["streams"] == 3
    changed = await set_limits(client, tokens, queued_jobs=7, log_lines=10)
    assert (changed["streams"], changed["queued_jobs"], changed["log_lines"]) == (3, 7, 10)
    one = await (await client.get("/v1/tenants/acme", headers=admin)).json()
    assert one["limits"] == changed
    globex = await (await client.get("/v1/tenants/globex/limits", headers=admin)).json()
    assert globex == defaults
    recorded = await owner.fetch(
        "SELECT data FROM events WHERE stream_id = 'tenant-acme' AND type = 'TenantLimitsSet'"
    )
    assert len(recorded) == 2
    assert json.loads(recorded[-1]["data"])["limits"] == changed
    audited = await owner.fetch(
        "SELECT actor, action FROM audit.actions WHERE event_type = 'TenantLimitsSet'"
    )
    assert [tuple(r) for r in audited] == [("admin", "tenant_limits_set")] * 2


@pytest.mark.parametrize(
    ("path", "body", "token", "status", "field"),
    [
        ("/v1/tenants/acme/limits", {"streams": 0}, "admin", 422, "streams"),
        ("/v1/tenants/acme/limits", {"submissions_per_s": -1}, "admin", 422, "submissions_per_s"),
        ("/v1/tenants/acme/limits", {"log_lines": "many"}, "admin", 422, "log_lines"),
        ("/v1/tenants/acme/limits", {"stream": 3}, "admin", 422, "stream"),
        ("/v1/tenants/acme/limits", {}, "admin", 422, None),
        ("/v1/tenants/nobody/limits", {"streams": 3}, "admin", 404, None),
        ("/v1/tenants/acme/limits", {"streams": 3}, "acme", 403, None),
    ],
)
async def test_bad_limits_are_refused_and_write_nothing(
    client: Client,
    tokens: Tokens,
    owner: asyncpg.Connection,
    path: str,
    body: Any,
    token: str,
    status: int,
    field: str | None,
) -> None:
    before = await event_count(owner)
    response = await client.put(path, json=body, headers=auth(getattr(tokens, token)))
    assert response.status == status
    if field is not None:
        assert field in [f["field"] for f in (await response.json())["fields"]]
    assert await event_count(owner) == before


async def test_submissions_past_the_tenants_rate_are_429_with_retry_after(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    await set_limits(client, tokens, submissions_per_s=0.01, submission_burst=2)
    acme = auth(tokens.acme)
    keyed = {**acme, "Idempotency-Key": "retry-me"}
    first = await client.post("/v1/jobs", json=MANIFEST, headers=keyed)
    assert first.status == 201
    assert (await client.post("/v1/jobs", json=MANIFEST, headers=acme)).status == 201
    before = await event_count(owner)
    refused = await client.post("/v1/jobs", json=MANIFEST, headers=acme)
    assert refused.status == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 100
    body = await refused.json()
    assert body["field"] == "submissions_per_s" and "0.01 jobs per second" in body["error"]
    assert await event_count(owner) == before
    # A retry of an accepted submission finds its job (its first try passed the limits).
    retried = await client.post("/v1/jobs", json=MANIFEST, headers=keyed)
    assert retried.status == 201 and retried.headers["Idempotent-Replayed"] == "true"
    assert (await retried.json())["id"] == (await first.json())["id"]
    assert await event_count(owner) == before
    # Another tenant's bucket is its own.
    assert (await client.post("/v1/jobs", json=MANIFEST, headers=auth(tokens.globex))).status == 201


async def test_past_the_queued_jobs_limit_a_submission_is_429_and_writes_nothing(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await set_limits(client, tokens, queued_jobs=2)
    acme = auth(tokens.acme)
    for _ in range(2):
        assert (await client.post("/v1/jobs", json=MANIFEST, headers=acme)).status == 201

    async def both_queued() -> bool:
        return await pool.fetchval("SELECT count(*) FROM job_status WHERE tenant = 'acme'") == 2

    await eventually(both_queued)
    before = await event_count(owner)
    refused = await client.post("/v1/jobs", json=MANIFEST, headers=acme)
    assert refused.status == 429
    body = await refused.json()
    assert body["field"] == "queued_jobs" and "2 jobs QUEUED" in body["error"]
    assert await event_count(owner) == before


async def test_a_job_carries_the_limits_of_its_tenant_at_submission(
    client: Client, tokens: Tokens
) -> None:
    await set_limits(client, tokens, log_lines=10, log_bytes=1000, reports_per_s=0.5)
    acme = auth(tokens.acme)
    first = await (await client.post("/v1/jobs", json=MANIFEST, headers=acme)).json()
    assert first["limits"] == {"log_lines": 10, "log_bytes": 1000, "reports_per_s": 0.5}
    await set_limits(client, tokens, log_lines=20)
    second = await (await client.post("/v1/jobs", json=MANIFEST, headers=acme)).json()
    assert second["limits"]["log_lines"] == 20
    # A job keeps the limits it was accepted with.
    again = await (await client.get(f"/v1/jobs/{first['id']}", headers=acme)).json()
    assert again["limits"]["log_lines"] == 10


async def test_a_job_needing_more_memory_than_any_node_has_is_422(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    acme = auth(tokens.acme)
    # No node known yet: only the manifest's own bound applies.
    big = {**MANIFEST, "memory_mb": 100_000}
    assert (await client.post("/v1/jobs", json=big, headers=acme)).status == 201
    nodes = Nodes(pool, EventStore(pool, EVENT_REGISTRY))
    await nodes.register(NodeSpec("n1", uuid4(), "process", 8, 65536, []), ttl_s=60)
    before = await event_count(owner)
    refused = await client.post("/v1/jobs", json=big, headers=acme)
    assert refused.status == 422
    body = await refused.json()
    assert body["field"] == "memory_mb" and "65536 MiB" in body["error"]
    assert await event_count(owner) == before
    fits = {**MANIFEST, "memory_mb": 65536}
    assert (await client.post("/v1/jobs", json=fits, headers=acme)).status == 201


async def test_the_cli_shows_and_sets_limits(cli: Cli, owner: asyncpg.Connection) -> None:
    assert (await cli("create", "acme"))[0] == 0
    code, out, err = await cli("limits", "acme", "--streams", "4", "--submissions-per-s", "2.5")
    assert code == 0, err
    rows = dict(line.split() for line in out.splitlines()[1:])
    assert (rows["streams"], rows["submissions_per_s"]) == ("4", "2.5")
    assert rows["log_bytes"] == str(TenantLimits().log_bytes)
    code, out, err = await cli("limits", "acme", "--output", "json")
    assert code == 0, err
    assert json.loads(out)["streams"] == 4

    before = await event_count(owner)
    for args, expected, message in [
        (["limits", "acme", "--streams", "0"], 2, "invalid streams '0'"),
        (["limits", "acme", "--queued-jobs", "lots"], 2, "invalid queued_jobs 'lots'"),
        (["limits", "nobody", "--streams", "2"], 4, "no tenant named 'nobody'"),
    ]:
        code, out, err = await cli(*args)
        assert (code, out) == (expected, ""), (args, err)
        assert message in err and len(err.splitlines()) == 1, err
    assert await event_count(owner) == before


async def test_oversized_manifests_are_422_naming_each_field_and_write_nothing(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    before = await event_count(owner)
    oversized = {
        **MANIFEST,
        "command": ["python", "x" * 20_000],
        "env": {f"V{i}": "" for i in range(300)},
        "labels": {"k" * 64: "v"},
        "memory_mb": 1 << 40,
        "restart_on": "sometimes",
    }
    refused = await client.post("/v1/jobs", json=oversized, headers=auth(tokens.acme))
    assert refused.status == 422
    fields = {f["field"]: f["message"] for f in (await refused.json())["fields"]}
    assert set(fields) == {"command", "env", "labels", "memory_mb", "restart_on"}
    assert "word 1 has 20000 characters; at most 16384" in fields["command"]
    assert "a label's key has 64 characters; at most 63" in fields["labels"]
    assert await event_count(owner) == before


async def test_a_checkpoint_request_while_one_is_pending_is_409_and_writes_nothing(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    acme = auth(tokens.acme)
    job = await (await client.post("/v1/jobs", json=MANIFEST, headers=acme)).json()
    jobs, job_id = client.app[JOBS], UUID(job["id"])
    agent = Metadata.capture("agent:n1")
    await jobs.execute(job_id, Deploy(["n1"], [], 1, SYSTEM_CLOCK.now()), agent)
    await jobs.execute(job_id, EnterPhase(JobStatus.PROCESSING, SYSTEM_CLOCK.now()), agent)

    path = f"/v1/jobs/{job_id}/checkpoint"
    assert (await client.post(path, headers=acme)).status == 202
    before = await event_count(owner)
    for _ in range(3):
        again = await client.post(path, headers=acme)
        assert again.status == 409
        assert "is still pending" in (await again.json())["error"]
    assert await event_count(owner) == before
    await jobs.execute(job_id, SaveCheckpoint(10, "/ckpt/10", 1, 0.1, SYSTEM_CLOCK.now()), agent)
    assert (await client.post(path, headers=acme)).status == 202


async def test_live_streams_are_limited_per_tenant_and_in_all(
    db_url: str, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    app = create_app(db_url, poll_interval=0.2, sse_heartbeat_s=0.1, max_streams=4)
    async with TestClient(TestServer(app)) as client:
        await set_limits(client, tokens, streams=2)
        acme, globex = auth(tokens.acme), auth(tokens.globex)
        job = await (await client.post("/v1/jobs", json=MANIFEST, headers=acme)).json()
        other = await (await client.post("/v1/jobs", json=MANIFEST, headers=globex)).json()
        events, logs = f"/v1/jobs/{job['id']}/events", f"/v1/jobs/{job['id']}/logs?follow=true"
        before = await event_count(owner)

        held = [await client.get(events, headers=acme), await client.get(logs, headers=acme)]
        assert [r.status for r in held] == [200, 200]
        for path in (events, logs):
            refused = await client.get(path, headers=acme)
            assert refused.status == 429
            assert refused.headers["Retry-After"] == "10"
            body = await refused.json()
            assert body["field"] == "streams" and "its limit is 2" in body["error"]
        # Text (not followed) logs end at once: no live stream, no limit.
        assert (await client.get(f"/v1/jobs/{job['id']}/logs", headers=acme)).status == 200

        # The server's limit counts everyone's, the admin's included.
        theirs = f"/v1/jobs/{other['id']}/events"
        held.append(await client.get(theirs, headers=globex))
        held.append(await client.get(events, headers=auth(tokens.admin)))
        assert [r.status for r in held[2:]] == [200, 200]
        full = await client.get(theirs, headers=globex)
        assert full.status == 429 and "at most 4 live streams" in (await full.json())["error"]

        # A stream the client closed is released (its next heartbeat finds it gone).
        held.pop(0).close()

        async def admitted() -> bool:
            response = await client.get(events, headers=acme)
            if response.status == 200:
                held.append(response)
                return True
            return False

        await eventually(admitted, seconds=10)
        assert await event_count(owner) == before
        for response in held:
            response.close()


async def test_the_limits_and_their_refusals_are_in_the_openapi_document(client: Client) -> None:
    document = await (await client.get("/openapi.json")).json()
    paths = document["paths"]
    assert set(paths["/v1/tenants/{name}/limits"]) == {"get", "put"}
    assert set(document["components"]["schemas"]["TenantLimits"]["properties"]) == set(
        TenantLimits.model_fields
    )
    assert "429" in paths["/v1/jobs"]["post"]["responses"]
    assert "429" in paths["/v1/jobs/{job_id}/events"]["get"]["responses"]
    assert "429" in paths["/v1/jobs/{job_id}/logs"]["get"]["responses"]
    manifest = document["components"]["schemas"]["JobManifest"]["properties"]
    assert manifest["restart_on"]["enum"] == ["any_failure", "infrastructure"]
    assert manifest["labels"]["maxProperties"] == 64


@pytest.mark.parametrize(
    ("value", "expected"), [(None, 1000), ("", 1000), (" 5 ", 5), ("0", None), ("many", None)]
)
def test_the_servers_stream_limit_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: int | None
) -> None:
    if value is None:
        monkeypatch.delenv(MAX_STREAMS_ENV, raising=False)
    else:
        monkeypatch.setenv(MAX_STREAMS_ENV, value)
    if expected is None:
        with pytest.raises(ValueError, match="TRAINYARD_MAX_STREAMS must be a whole number"):
            max_streams_from_env()
    else:
        assert max_streams_from_env() == expected
