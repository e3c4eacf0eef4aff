"""Autoscaling through the system, on a real Postgres with a real agent and replicas (the process
runtime): a deployment scaled to zero answers a synchronous request (queued, since no replica
is offered, it makes the sweep start one, which claims it), goes back to zero once idle, and
each move is an event carrying the load that drove it; bad autoscaling specs change nothing."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from tests.controlplane.deployments.serving import (
    Client,
    deploy,
    predict,
    publish,
    serving_cluster,
)
from tests.controlplane.deployments.test_serving import DOUBLE
from tests.polling import eventually
from tests.tenancy import Tokens, auth
from trainyard.client import AsyncClient

AUTOSCALING = {
    "min_replicas": 0,
    "max_replicas": 2,
    "target_in_flight": 1,
    "scale_down_delay_s": 2,
}


async def moves(client: Client, token: str, name: str) -> list[dict[str, Any]]:
    """The deployment's autoscaling moves, in order, as its history shows them."""
    response = await client.get(f"/v1/deployments/{name}/history", headers=auth(token))
    assert response.status == 200, await response.text()
    history = (await response.json())["history"]
    moved = [entry for entry in history if entry["event"] == "DeploymentAutoscaled"]
    assert all(entry["actor"] == "system:autoscaler" for entry in moved)
    return [entry["data"] for entry in moved]


async def replica_jobs(client: Client, token: str, name: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/deployments/{name}", headers=auth(token))
    view: dict[str, Any] = await response.json()
    jobs: list[dict[str, Any]] = view["replica_jobs"]
    return jobs


async def test_scaled_to_zero_a_synchronous_request_waits_for_a_replica_and_is_answered(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        view = await deploy(
            client,
            tokens.acme,
            name="dbl",
            model="double",
            serving={"memo": False},
            autoscaling=AUTOSCALING,
        )
        assert (view["replicas"], view["replica_jobs"]) == (0, [])
        assert view["autoscaling"] == {**AUTOSCALING, "target_in_flight": 1.0}
        # No replica: the direct path has none to offer, so the request is queued as a row and
        # waits (its synchronous wait), the sweep sees it waiting and starts a replica.
        status, task = await predict(client, tokens.acme, "dbl", [1, 2, 3])
        assert (status, task["status"], task["outputs"]) == (200, "succeeded", [2, 4, 6])
        claimed = await pool.fetchval(
            "SELECT claimed_at FROM serving_tasks WHERE task_id = $1", uuid.UUID(task["task_id"])
        )
        assert claimed is not None  # the queue's path: claimed by the new replica's feed
        up = (await moves(client, tokens.acme, "dbl"))[0]
        assert (up["previous"], up["replicas"], up["waiting"]) == (0, 1, 1)
        assert up["in_flight"] >= 1

        # Idle for the delay: back to zero, its replica's job stopped.
        async def down() -> bool:
            return not await replica_jobs(client, tokens.acme, "dbl")

        await eventually(down, seconds=60)
        last = (await moves(client, tokens.acme, "dbl"))[-1]
        assert (last["previous"], last["replicas"], last["waiting"]) == (1, 0, 0)
        assert last["idle_s"] >= AUTOSCALING["scale_down_delay_s"]
        # Idle from the request's answer, not from its arrival (it waited for the replica to
        # start): the move came at least the delay after the last finish.
        response = await client.get("/v1/deployments/dbl/history", headers=auth(tokens.acme))
        history = (await response.json())["history"]
        moved_at = [e["at"] for e in history if e["event"] == "DeploymentAutoscaled"][-1]
        finished = await pool.fetchval(
            "SELECT max(finished_at) FROM serving_tasks WHERE deployment = 'dbl'"
        )
        idle = datetime.fromisoformat(moved_at) - finished
        assert idle >= timedelta(seconds=AUTOSCALING["scale_down_delay_s"])
        # And again from zero: nothing lost.
        status, task = await predict(client, tokens.acme, "dbl", [5])
        assert (status, task["outputs"]) == (200, [10])


async def test_autoscaling_is_checked_and_exclusive_with_a_fixed_number(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path, agents=0) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        bad: list[tuple[dict[str, Any], str]] = [
            ({"replicas": 2, "autoscaling": AUTOSCALING}, "replicas"),
            ({"autoscaling": {**AUTOSCALING, "max_replicas": 0}}, "autoscaling.max_replicas"),
            (
                {"autoscaling": {"min_replicas": 3, "max_replicas": 2}},
                "autoscaling.max_replicas",
            ),
            (
                {"autoscaling": {**AUTOSCALING, "target_in_flight": 0}},
                "autoscaling.target_in_flight",
            ),
            # The load over it overflowed to infinity, and every sweep failed (found by review).
            (
                {"autoscaling": {**AUTOSCALING, "target_in_flight": 5e-324}},
                "autoscaling.target_in_flight",
            ),
            ({"autoscaling": {**AUTOSCALING, "min_replicas": -1}}, "autoscaling.min_replicas"),
            ({"autoscaling": {**AUTOSCALING, "max_replicas": 65}}, "autoscaling.max_replicas"),
            (
                {"autoscaling": {**AUTOSCALING, "scale_down_delay_s": 0}},
                "autoscaling.scale_down_delay_s",
            ),
            ({"autoscaling": {"min_replicas": 0}}, "autoscaling.max_replicas"),
            ({"autoscaling": {**AUTOSCALING, "step": 2}}, "autoscaling.step"),
        ]
        for extra, field in bad:
            body = {"name": "dbl", "model": "double", **extra}
            response = await client.post("/v1/deployments", json=body, headers=auth(tokens.acme))
            assert response.status == 422, (extra, await response.text())
            assert field in await response.text(), (extra, await response.text())
        assert await pool.fetchval("SELECT count(*) FROM deployments") == 0
        await deploy(client, tokens.acme, name="dbl", model="double", autoscaling=AUTOSCALING)
        # Its load sets its replicas: a fixed number is refused, and changes nothing.
        response = await client.patch(
            "/v1/deployments/dbl", json={"replicas": 3}, headers=auth(tokens.acme)
        )
        assert response.status == 409, await response.text()
        assert "autoscaled" in await response.text()
        response = await client.get("/v1/deployments/dbl", headers=auth(tokens.acme))
        assert (await response.json())["replicas"] == 0
        # Turned off, its replicas stay what they are, and a fixed number is its owner's again.
        path = "/v1/deployments/dbl/autoscaling"
        response = await client.delete(path, headers=auth(tokens.acme))
        assert response.status == 200, await response.text()
        assert (await response.json())["autoscaling"] is None
        response = await client.patch(
            "/v1/deployments/dbl", json={"replicas": 2}, headers=auth(tokens.acme)
        )
        assert (response.status, (await response.json())["replicas"]) == (200, 2)
        # And on again, within new bounds; checked as at deploy, a bad one changing nothing.
        bounds = {"min_replicas": 3, "max_replicas": 2}
        response = await client.put(path, json=bounds, headers=auth(tokens.acme))
        assert response.status == 422 and "max_replicas" in await response.text()
        bounds = {"min_replicas": 1, "max_replicas": 3, "target_in_flight": 2}
        response = await client.put(path, json=bounds, headers=auth(tokens.acme))
        assert response.status == 200, await response.text()
        assert (await response.json())["autoscaling"] == {
            **bounds,
            "target_in_flight": 2.0,
            "scale_down_delay_s": 60.0,
        }
        response = await client.get("/v1/deployments/dbl/history", headers=auth(tokens.acme))
        history = (await response.json())["history"]
        changes = [
            (entry["event"], entry["data"].get("autoscaling"), entry["data"].get("replicas"))
            for entry in history[1:]
            if not entry["event"].startswith("Replica")
        ]
        assert changes == [
            ("DeploymentAutoscalingSet", None, None),
            ("DeploymentScaled", None, 2),
            ("DeploymentAutoscalingSet", {**bounds, "scale_down_delay_s": 60.0}, None),
        ]

        async def projected() -> bool:
            spec = await pool.fetchval("SELECT spec::text FROM deployments WHERE name = 'dbl'")
            return spec is not None and '"max_replicas": 3' in spec  # its row may come late

        await eventually(projected)
        # The history in pages (an autoscaled deployment's grows for ever): two at a time,
        # each page's next_after the next one's after, the whole as one read.
        paged: list[dict[str, Any]] = []
        after: int | None = 0
        while after is not None:
            response = await client.get(
                f"/v1/deployments/dbl/history?after={after}&limit=2", headers=auth(tokens.acme)
            )
            page = await response.json()
            assert response.status == 200 and len(page["history"]) <= 2, page
            paged.extend(page["history"])
            after = page["next_after"]
        assert paged[: len(history)] == history
        # The SDK reads it whole, page after page.
        async with AsyncClient(str(client.make_url("")).rstrip("/"), tokens.acme) as sdk:
            read = await sdk.deployment_history("dbl")
        assert read[: len(history)] == history
        for wrong in ("limit=0", "limit=1001", "after=-1"):
            response = await client.get(
                f"/v1/deployments/dbl/history?{wrong}", headers=auth(tokens.acme)
            )
            assert response.status == 400, wrong
        # Another tenant's deployment is not there to change.
        response = await client.delete(path, headers=auth(tokens.globex))
        assert response.status == 404
        # Its history is its tenant's only.
        for path, token in (("dbl", tokens.globex), ("nope", tokens.acme)):
            response = await client.get(f"/v1/deployments/{path}/history", headers=auth(token))
            assert response.status == 404, path
