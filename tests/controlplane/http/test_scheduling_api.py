"""`GET` and `PUT /v1/scheduling/policy` on a real Postgres: every token reads the claim policy,
only the admin's switches it (403 otherwise, 422 naming a bad field, nothing written either
way), the switch is recorded once and audited, and the next claim follows it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.http.app import create_app
from controlplane.http.keys import STORE
from controlplane.scheduling.events import SchedulingPolicySet
from controlplane.scheduling.streams import POLICY_STREAM
from tests.tenancy import Tokens, auth, event_count

Client = TestClient[web.Request, web.Application]
PATH = "/v1/scheduling/policy"


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(db_url, poll_interval=0.2))) as client:
        yield client


async def test_the_admin_switches_the_policy_once_and_every_token_reads_it(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    admin = auth(tokens.admin)
    default = await (await client.get(PATH, headers=auth(tokens.acme))).json()
    assert default == {
        "order": "fair_share",
        "quotas": True,
        "set_by": None,
        "set_at": None,
        "reason": None,
        "changed": None,
    }
    before = await event_count(owner)
    body = {"order": "fifo", "quotas": False, "reason": "the night's batch"}
    switched = await client.put(PATH, json=body, headers=admin)
    assert switched.status == 200
    view = await switched.json()
    assert (view["order"], view["quotas"], view["set_by"], view["changed"]) == (
        "fifo",
        False,
        "admin",
        True,
    )
    assert view["reason"] == "the night's batch" and view["set_at"]
    # The same again changes nothing and writes nothing.
    again = await (await client.put(PATH, json=body, headers=admin)).json()
    assert again["changed"] is False and again["set_at"] == view["set_at"]
    assert await event_count(owner) == before + 1
    [recorded] = await client.app[STORE].read_stream(POLICY_STREAM)
    assert isinstance(recorded.event, SchedulingPolicySet)
    assert (recorded.event.actor, recorded.event.reason) == ("admin", "the night's batch")
    read = await (await client.get(PATH, headers=auth(tokens.globex))).json()
    # A tenant reads the policy and when it was set; who and why are the operators'.
    assert {k: read[k] for k in ("order", "quotas", "set_by", "reason")} == {
        "order": "fifo",
        "quotas": False,
        "set_by": None,
        "reason": None,
    }
    assert read["set_at"] == view["set_at"]
    read = await (await client.get(PATH, headers=admin)).json()
    assert (read["set_by"], read["reason"]) == ("admin", "the night's batch")
    # What claims read, in the claim statement itself.
    row = await owner.fetchrow("SELECT claim_order, quotas FROM scheduling_policy")
    assert tuple(row) == ("fifo", False)
    actions = await owner.fetch(
        "SELECT action, actor, reason FROM audit.actions WHERE action LIKE 'scheduling_%'"
    )
    assert [tuple(a) for a in actions] == [("scheduling_policy_set", "admin", "the night's batch")]


async def test_only_the_admin_switches_and_a_bad_policy_names_its_field(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    before = await event_count(owner)
    refused = await client.put(PATH, json={"order": "fifo"}, headers=auth(tokens.acme))
    assert refused.status == 403
    assert "only the admin token" in (await refused.json())["error"]
    assert (await client.put(PATH, json={"order": "fifo"})).status == 401
    assert (await client.get(PATH)).status == 401
    admin = auth(tokens.admin)
    for body, field in [
        ({"order": "lottery"}, "order"),
        ({"quotas": False}, "order"),
        ({"order": "fifo", "quotas": "no"}, "quotas"),
        ({"order": "fifo", "weights": {"acme": 2}}, "weights"),
        ({"order": "fifo", "reason": ""}, "reason"),
    ]:
        invalid = await client.put(PATH, json=body, headers=admin)
        assert invalid.status == 422, body
        assert [f["field"] for f in (await invalid.json())["fields"]] == [field], body
    malformed = await client.put(PATH, data=b"{order", headers=admin)
    assert malformed.status == 400
    assert await event_count(owner) == before
    assert (await (await client.get(PATH, headers=admin)).json())["order"] == "fair_share"


async def test_the_policy_routes_are_in_the_openapi_document(client: Client) -> None:
    paths = (await (await client.get("/openapi.json")).json())["paths"]
    assert {"200", "401"} <= set(paths[PATH]["get"]["responses"])
    assert {"200", "401", "403", "422"} <= set(paths[PATH]["put"]["responses"])
