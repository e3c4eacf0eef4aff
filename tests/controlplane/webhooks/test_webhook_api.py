"""Webhooks through the served control plane: tenants read and rotate their signing secrets,
a rotation signs with both secrets for a while, and a job's history shows its deliveries."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.clock import SYSTEM_CLOCK
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.http.app import create_app
from controlplane.http.keys import POOL, STORE
from controlplane.jobs.lifecycle import Fail
from controlplane.jobs.service import Jobs
from controlplane.projections.runner import ProjectionRunner
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import issue_token
from controlplane.webhooks.events import WebhookSecretRotated
from controlplane.webhooks.signing import verify
from controlplane.webhooks.tenant_secrets import rotate, signing_secrets
from tests.controlplane.webhooks.test_webhooks import FAST
from tests.polling import eventually
from tests.receivers import Receiver, receiving
from tests.tenancy import Cli, Tokens, auth
from trainyard import render

Client = TestClient[Any, Any]


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    app = create_app(db_url, poll_interval=0.2, relay=FAST)
    async with TestClient(TestServer(app)) as client:
        yield client


async def fail_job(client: Client, token: str, url: str) -> UUID:
    """Submit a job notifying `url`, and fail it (as its agent would report)."""
    manifest = {"name": "j", "image": "i", "command": ["x"], "webhook_url": url}
    response = await client.post("/v1/jobs", json=manifest, headers=auth(token))
    assert response.status == 201, await response.text()
    job_id = UUID((await response.json())["id"])
    jobs = Jobs(client.app[STORE])
    await jobs.execute(job_id, Fail("boom", SYSTEM_CLOCK.now()), Metadata(actor="agent:n1"))
    return job_id


async def delivered(receiver: Receiver, count: int) -> None:
    async def arrived() -> bool:
        return len(receiver.received) == count

    await eventually(arrived)


async def test_a_tenant_reads_and_rotates_its_secret_and_deliveries_are_signed_with_it(
    client: Client, tokens: Tokens
) -> None:
    acme = auth(tokens.acme)
    response = await client.get("/v1/webhook-secret", headers=acme)
    assert response.status == 404  # none issued yet
    response = await client.post("/v1/webhook-secret", headers=acme)
    assert response.status == 201
    first = await response.json()
    assert first["tenant"] == "acme" and first["previous_valid_until"] is None
    assert first["secret"].startswith("whsec_")

    async with receiving() as receiver:
        await fail_job(client, tokens.acme, receiver.url)
        await delivered(receiver, 1)
        signed = receiver.received[0]
        assert signed.signed_with(first["secret"])
        header = signed.headers["Trainyard-Signature"]
        assert verify(header, first["secret"], signed.body)
        assert not verify(header, first["secret"], signed.body + b" ")
        assert not verify(header, first["secret"], signed.body, now=1e10)  # too old a time

        # Rotation: the new secret, and the old one for 24 hours more, both sign.
        second = await (await client.post("/v1/webhook-secret", headers=acme)).json()
        assert second["id"] != first["id"] and second["previous_valid_until"] is not None
        listed = await (await client.get("/v1/webhook-secret", headers=acme)).json()
        assert [s["id"] for s in listed["secrets"]] == [second["id"], first["id"]]
        assert listed["secrets"][0]["valid_until"] is None
        assert listed["secrets"][1]["valid_until"] == second["previous_valid_until"]
        job_id = await fail_job(client, tokens.acme, receiver.url)
        await delivered(receiver, 2)
        both = receiver.received[1]
        assert both.signed_with(second["secret"]) and both.signed_with(first["secret"])
        assert both.headers["Trainyard-Signature"].count("v1=") == 2

    async def recorded() -> bool:
        response = await client.get(f"/v1/jobs/{job_id}/history", headers=acme)
        history.update(await response.json())
        return bool(history["webhooks"])

    history: dict[str, Any] = {}
    await eventually(recorded)  # the receiver has answered; the relay records it just after
    assert [e["event"] for e in history["history"]] == ["JobSubmitted", "JobFailed"]
    [entry] = history["webhooks"]
    assert entry["event"] == "WebhookDelivered"
    assert (entry["job_event"], entry["attempt"], entry["status"]) == ("JobFailed", 1, 200)
    assert entry["delivery_id"] == both.delivery_id
    assert entry["job_event_position"] == history["history"][1]["position"]
    job = await (await client.get(f"/v1/jobs/{job_id}", headers=acme)).json()
    shown = render.job_status(job, history["history"], history["webhooks"]).splitlines()
    row = shown[shown.index("webhooks:") + 2].split()  # under the headers
    assert row[1:5] == ["JobFailed", "1", "delivered", "200"]

    # The tenant's stream records each rotation, never the secret itself.
    rotations = [
        r
        for r in await client.app[STORE].read_stream("tenant-acme")
        if isinstance(r.event, WebhookSecretRotated)
    ]
    assert [(r.event.secret_id, r.metadata.actor) for r in rotations] == [
        (first["id"], "tenant:acme"),
        (second["id"], "tenant:acme"),
    ]
    stored = await client.app[POOL].fetch("SELECT data::text FROM events")
    assert not any(first["secret"] in r["data"] or second["secret"] in r["data"] for r in stored)


async def test_only_its_tenant_and_the_admin_manage_a_secret(
    client: Client, tokens: Tokens
) -> None:
    assert (await client.post("/v1/webhook-secret", headers=auth(tokens.acme))).status == 201
    globex = auth(tokens.globex)
    denied = await client.get("/v1/webhook-secret?tenant=acme", headers=globex)
    assert denied.status == 403
    assert (await client.get("/v1/webhook-secret", headers=globex)).status == 404
    admin = auth(tokens.admin)
    assert (await client.get("/v1/webhook-secret", headers=admin)).status == 400
    seen = await client.get("/v1/webhook-secret?tenant=acme", headers=admin)
    assert seen.status == 200 and len((await seen.json())["secrets"]) == 1
    missing = await client.post("/v1/webhook-secret?tenant=nobody", headers=admin)
    assert missing.status == 404
    assert (await client.get("/v1/webhook-secret")).status == 401


async def test_rotations_racing_each_other_and_token_commands_all_land(
    pool: asyncpg.Pool, store: EventStore, db_url: str, tokens: Tokens
) -> None:
    runner = ProjectionRunner(pool, store, LogListener(db_url), [TenantsProjection()])
    firsts = await asyncio.gather(
        *(rotate(pool, store, "acme", actor="test", unless_present=True) for _ in range(4))
    )
    assert sum(issued is not None for issued in firsts) == 1  # one first secret, not four
    results = await asyncio.gather(
        *(rotate(pool, store, "acme", actor="test") for _ in range(4)),
        *(issue_token(store, runner, "acme", actor="test") for _ in range(2)),
        return_exceptions=True,
    )
    assert not [r for r in results if isinstance(r, BaseException)]
    current = await signing_secrets(pool, "acme")
    assert len(current) == 5 and [s.valid_until is None for s in current].count(True) == 1
    rotations = [
        r.event
        for r in await store.read_stream("tenant-acme")
        if isinstance(r.event, WebhookSecretRotated)
    ]
    assert {r.secret_id for r in rotations} == {s.secret_id for s in current}


async def test_the_cli_rotates_a_secret(cli: Cli, pool: asyncpg.Pool) -> None:
    assert (await cli("create", "acme"))[0] == 0
    code, out, err = await cli("webhook-secret", "acme")
    assert code == 0, err
    [current] = await signing_secrets(pool, "acme")
    assert out == current.secret + "\n"
    assert err.startswith(f"issued webhook secret {current.secret_id} for tenant acme\n")
    code, out, err = await cli("webhook-secret", "acme")
    assert code == 0 and "the previous one signs deliveries too until" in err
    code, _, err = await cli("webhook-secret", "nobody")
    assert code == 4 and "no tenant named 'nobody'" in err


async def test_the_outbox_is_never_rebuilt(db_url: str) -> None:
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "cli", "projections", "rebuild", "webhook_outbox"),
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TRAINYARD_DATABASE_URL": db_url},
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    # Replaying it would send every old notification again.
    assert process.returncode == 2 and b"owns no tables to rebuild" in stderr
