"""Every parameter and body value the database would refuse is a 4xx naming it, sent before any
I/O: never a 500, and never a 200 whose stream breaks when Postgres refuses the value."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.http.app import create_app
from tests.tenancy import Tokens, auth, event_count

Client = TestClient[Any, Any]
MANIFEST = {"name": "params", "image": "img", "command": ["train"]}
PAST_INT4 = str(2**31)
PAST_INT8 = str(2**63)
OVERFLOWING_CURSOR = base64.urlsafe_b64encode(
    f"0001-01-01T00:00+01:00|{UUID(int=1)}".encode()
).decode()
"""A cursor (as the client may forge one) whose instant is before year 1 in UTC."""


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    app = create_app(db_url, poll_interval=0.2, sse_heartbeat_s=0.2)
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_parameters_out_of_range_or_unstorable_are_400_naming_them(
    client: Client, tokens: Tokens
) -> None:
    response = await client.post("/v1/jobs", json=MANIFEST, headers=auth(tokens.acme))
    assert response.status == 201, await response.text()
    job = (await response.json())["id"]
    acme, admin = tokens.acme, tokens.admin
    # (method, path, query, headers, token, field)
    cases: list[tuple[str, str, dict[str, str], dict[str, str], str, str]] = [
        ("GET", f"/v1/jobs/{job}/logs", {"learner": PAST_INT4}, {}, acme, "learner"),
        ("GET", f"/v1/jobs/{job}/logs", {"attempt": PAST_INT4}, {}, acme, "attempt"),
        (
            "GET",
            f"/v1/jobs/{job}/logs",
            {"attempt": PAST_INT4, "follow": "true"},
            {},
            acme,
            "attempt",
        ),
        ("GET", f"/v1/jobs/{job}/logs", {"learner": "1_0"}, {}, acme, "learner"),
        ("GET", f"/v1/jobs/{job}/logs", {"learner": "\u0661"}, {}, acme, "learner"),
        ("GET", f"/v1/jobs/{job}/logs", {"after": PAST_INT8}, {}, acme, "after"),
        (
            "GET",
            f"/v1/jobs/{job}/logs",
            {"follow": "true"},
            {"Last-Event-ID": PAST_INT8},
            acme,
            "Last-Event-ID",
        ),
        # A malformed `after` is refused also when a Last-Event-ID comes with it.
        ("GET", f"/v1/jobs/{job}/logs", {"after": "false"}, {"Last-Event-ID": "1"}, acme, "after"),
        (
            "GET",
            f"/v1/jobs/{job}/events",
            {"after": "false"},
            {"Last-Event-ID": "1"},
            acme,
            "after",
        ),
        ("GET", f"/v1/jobs/{job}/events", {"after": PAST_INT8}, {}, acme, "after"),
        ("GET", f"/v1/jobs/{job}/events", {}, {"Last-Event-ID": "7_0"}, acme, "Last-Event-ID"),
        ("GET", f"/v1/jobs/{job}", {"as_of": "0001-01-01T00:00:00+01:00"}, {}, acme, "as_of"),
        ("GET", f"/v1/jobs/{job}", {"as_of": "2024-05-01T12:00:00"}, {}, acme, "as_of"),
        ("GET", "/v1/jobs", {"limit": PAST_INT4}, {}, acme, "limit"),
        ("GET", "/v1/jobs", {"limit": "5_0"}, {}, acme, "limit"),
        ("GET", "/v1/jobs", {"state": "DONE"}, {}, acme, "state"),
        ("GET", "/v1/jobs", {"label": "team=\0"}, {}, acme, "label"),
        ("GET", "/v1/jobs", {"cursor": OVERFLOWING_CURSOR}, {}, acme, "cursor"),
        ("POST", "/v1/jobs", {"tenant": "ac\0me"}, {}, admin, "tenant"),
        ("POST", "/v1/jobs", {}, {"Idempotency-Key": "k" * 256}, acme, "Idempotency-Key"),
        ("GET", "/v1/webhook-secret", {"tenant": "\0"}, {}, admin, "tenant"),
        ("POST", "/v1/webhook-secret", {"tenant": "\0"}, {}, admin, "tenant"),
        ("GET", "/v1/deployments", {"tenant": "ac\0me"}, {}, admin, "tenant"),
        ("DELETE", "/v1/tenants/acme/tokens/%00", {}, {}, admin, "token_id"),
    ]
    for method, path, query, headers, token, field in cases:
        body = MANIFEST if (method, path) == ("POST", "/v1/jobs") else None
        response = await client.request(
            method, path, params=query, headers={**auth(token), **headers}, json=body
        )
        assert response.status == 400, (path, query, headers, response.status)
        answer = await response.json()
        assert (answer["status"], answer["field"]) == (400, field), answer


async def test_header_bytes_that_are_not_utf8_are_refused_not_a_server_error(
    client: Client, tokens: Tokens
) -> None:
    headers = [
        b"Authorization: Bearer ty_\xff\xfe",
        b"Authorization: Bearer " + tokens.acme.encode() + b"\r\nIdempotency-Key: k\xff",
        b"Authorization: Bearer " + tokens.acme.encode() + b"\r\nX-Request-ID: r\xff",
    ]
    statuses = []
    for header in headers:
        # Raw bytes: HTTP clients refuse to send them, but anyone can.
        reader, writer = await asyncio.open_connection(client.host, client.port)
        body = json.dumps(MANIFEST).encode()
        writer.write(
            b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n%s\r\n\r\n%s"
            % (len(body), header, body)
        )
        await writer.drain()
        statuses.append(int((await reader.read()).split(b" ", 2)[1]))
        writer.close()
    assert statuses == [401, 400, 400]


async def test_a_path_name_no_tenant_could_have_is_not_found(
    client: Client, tokens: Tokens
) -> None:
    for method in ("GET", "PATCH"):
        response = await client.request(
            method, "/v1/tenants/ac%00me", headers=auth(tokens.admin), json={"weight": 2}
        )
        assert response.status == 404, await response.text()
    response = await client.post("/v1/tenants/%00/tokens", headers=auth(tokens.admin), json={})
    assert response.status == 404, await response.text()
    response = await client.put(
        "/v1/tenants/ac%00me/limits", headers=auth(tokens.admin), json={"streams": 5}
    )
    assert response.status == 404, await response.text()


async def test_bodies_the_database_would_refuse_are_refused_and_write_nothing(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    response = await client.post("/v1/jobs", json=MANIFEST, headers=auth(tokens.acme))
    job = (await response.json())["id"]
    before = await event_count(owner)
    too_big: list[tuple[str, str, dict[str, Any], str]] = [
        ("POST", "/v1/jobs", {**MANIFEST, "memory_mb": 2**63}, "memory_mb"),
        ("POST", "/v1/jobs", {**MANIFEST, "checkpoint": {"keep": 2**31}}, "checkpoint.keep"),
        ("POST", "/v1/tenants", {"name": "initech", "gpu_quota": 2**31}, "gpu_quota"),
        ("PATCH", "/v1/tenants/acme", {"gpu_quota": 2**31}, "gpu_quota"),
    ]
    for method, path, body, field in too_big:
        token = tokens.acme if path == "/v1/jobs" else tokens.admin
        response = await client.request(method, path, json=body, headers=auth(token))
        assert response.status == 422, (body, await response.text())
        assert [f["field"] for f in (await response.json())["fields"]] == [field]

    malformed = [
        '{"name": "x", "memory_mb": 1' + "0" * 5000 + "}",  # past Python's limit on digits
        "[" * 100_000 + "]" * 100_000,  # past the parser's recursion limit
    ]
    for raw in malformed:
        for path in ("/v1/jobs", f"/v1/jobs/{job}/cancel"):
            response = await client.post(
                path,
                data=raw,
                headers={**auth(tokens.acme), "Content-Type": "application/json"},
            )
            assert response.status == 400, await response.text()
            assert json.loads(await response.text())["error"].startswith("malformed JSON")
    # Over the server's limit: a 413 that is an Error as every other refusal (the document
    # says so), not aiohttp's text.
    for path in ("/v1/jobs", f"/v1/jobs/{job}/cancel"):
        huge = {**MANIFEST, "command": ["train", "x" * 2**20]}
        response = await client.post(path, json=huge, headers=auth(tokens.acme))
        assert response.status == 413, await response.text()
        assert response.content_type == "application/json"
        assert (await response.json())["status"] == 413
    assert await event_count(owner) == before
