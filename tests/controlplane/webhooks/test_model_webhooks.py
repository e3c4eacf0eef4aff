"""A model's webhook, through the HTTP API, the outbox and the relay, to a real receiver: the
events of its versions and aliases while it is set, and none before or after, signed with the
tenant's secret; in the model's history and the audit views; only its tenant sets it, and only
to a URL the relay may reach."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.http.app import create_app
from controlplane.webhooks.tenant_secrets import signing_secrets
from tests.controlplane.http.test_models_api import publish
from tests.controlplane.webhooks.test_webhooks import FAST, until_settled
from tests.receivers import body_of, receiving
from tests.tenancy import Tokens, auth, event_count

Client = TestClient[Any, Any]


@pytest.fixture
async def client(db_url: str, tmp_path: Path) -> AsyncIterator[Client]:
    app = create_app(
        db_url,
        poll_interval=0.2,
        relay=FAST,
        artifacts=FileArtifactStore(tmp_path / "artifacts"),
    )
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_a_models_events_are_notified_while_its_webhook_is_set(
    client: Client, tokens: Tokens, pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    acme = auth(tokens.acme)
    async with receiving() as receiver:
        await publish(client, tokens.acme, "m", b"one", visibility="public")  # before: untold
        response = await client.put(
            "/v1/models/m/webhook", json={"url": receiver.url}, headers=acme
        )
        assert (response.status, await response.json()) == (200, {"url": receiver.url})
        await publish(client, tokens.acme, "m", b"two")
        await client.put("/v1/models/m/aliases/production", json={"version": 2}, headers=acme)
        await client.post("/v1/models/m/versions/1/deprecate", json={"reason": "old"}, headers=acme)
        assert (await client.delete("/v1/models/m/webhook", headers=acme)).status == 204
        await client.put("/v1/models/m/aliases/staging", json={"version": 2}, headers=acme)
        await until_settled(pool, 3)

    received = sorted(receiver.received, key=lambda r: body_of(r)["position"])
    bodies = [body_of(r) for r in received]
    assert [b["type"] for b in bodies] == [
        "ModelVersionPublished",
        "ModelAliasSet",
        "ModelVersionDeprecated",
    ]
    assert {(b["tenant"], b["model"]) for b in bodies} == {("acme", "m")}
    assert bodies[0]["data"]["version"] == 2
    assert bodies[1]["data"] == {**bodies[1]["data"], "alias": "production", "previous": None}
    assert all(
        r.headers["Trainyard-Event"] == b["type"] for r, b in zip(received, bodies, strict=True)
    )
    [secret] = await signing_secrets(pool, "acme")
    assert all(r.signed_with(secret.secret) for r in received)

    history = await (await client.get("/v1/models/m/history", headers=acme)).json()
    # In the order the attempts ended: three at once, in any order.
    delivered = sorted(history["webhooks"], key=lambda w: w["job_event_position"])
    assert [(w["event"], w["job_event"]) for w in delivered] == [
        ("WebhookDelivered", b["type"]) for b in bodies
    ]
    audited = await owner.fetch(
        "SELECT job_id, tenant, model, job_event, outcome FROM audit.webhook_attempts"
        " ORDER BY job_event_position"
    )
    assert [tuple(row) for row in audited] == [
        (None, "acme", "acme/m", b["type"], "delivered") for b in bodies
    ]
    actions = await owner.fetch(
        "SELECT action, actor FROM audit.actions WHERE action LIKE 'model_webhook%' ORDER BY at"
    )
    assert [tuple(a) for a in actions] == [
        ("model_webhook_set", "tenant:acme"),
        ("model_webhook_remove", "tenant:acme"),
    ]


async def test_only_the_tenant_sets_its_models_webhook_and_only_to_a_reachable_url(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    acme, globex = auth(tokens.acme), auth(tokens.globex)
    await publish(client, tokens.acme, "m", visibility="public")
    before = await event_count(owner)
    for url in ("http://10.1.2.3/hook", "http://169.254.169.254/latest"):
        refused = await client.put("/v1/models/m/webhook", json={"url": url}, headers=acme)
        assert (refused.status, (await refused.json())["field"]) == (403, "url"), url
    not_http = await client.put(
        "/v1/models/m/webhook", json={"url": "ftp://example.org/"}, headers=acme
    )
    assert [f["field"] for f in (await not_http.json())["fields"]] == ["url"]
    hook = {"url": "http://127.0.0.1:9/hook"}
    forbidden = await client.put(
        "/v1/models/m/webhook", params={"tenant": "acme"}, json=hook, headers=globex
    )
    assert forbidden.status == 403
    assert (await client.put("/v1/models/m/webhook", json=hook, headers=globex)).status == 404
    assert await event_count(owner) == before

    assert (await client.put("/v1/models/m/webhook", json=hook, headers=acme)).status == 200
    mine = await (await client.get("/v1/models/m", headers=acme)).json()
    assert mine["webhook_url"] == hook["url"]
    theirs = await (
        await client.get("/v1/models/m", params={"tenant": "acme"}, headers=globex)
    ).json()
    assert theirs["webhook_url"] is None  # the owner's business, even on a public model
