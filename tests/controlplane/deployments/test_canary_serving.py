"""Canaries through the system, on a real Postgres with a real agent and replicas (the process
runtime): requests split by weight between two versions on the direct path and the queue's,
each version memoized under its own; promotion moves everything; a canary whose model raises
rolls back by itself, its event saying why; bad canaries change nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg

from tests.controlplane.deployments.serving import (
    Client,
    deploy,
    predict,
    publish,
    serving_cluster,
    until_serving,
)
from tests.controlplane.deployments.test_serving import DOUBLE, FAILING
from tests.polling import eventually
from tests.tenancy import Tokens, auth

TRIPLE = b"def predict(batch):\n    return [x * 3 for x in batch]\n"


async def set_canary(client: Client, token: str, name: str, **body: Any) -> dict[str, Any]:
    response = await client.put(f"/v1/deployments/{name}/canary", json=body, headers=auth(token))
    assert response.status == 200, await response.text()
    view: dict[str, Any] = await response.json()
    return view


async def canary_serving(client: Client, token: str, name: str) -> dict[str, Any]:
    """The deployment once its canary's replica is PROCESSING."""
    view: dict[str, Any] = {}

    async def ready() -> bool:
        nonlocal view
        response = await client.get(f"/v1/deployments/{name}", headers=auth(token))
        view = await response.json()
        canary = view["canary"]
        return canary is not None and [r["state"] for r in canary["replica_jobs"]] == ["PROCESSING"]

    await eventually(ready, seconds=60)
    return view


async def history(client: Client, token: str, name: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/deployments/{name}/history", headers=auth(token))
    assert response.status == 200, await response.text()
    entries: list[dict[str, Any]] = (await response.json())["history"]
    return [e for e in entries if e["event"].startswith("Canary")]


async def outputs(client: Client, token: str, name: str, n: int, **options: Any) -> list[Any]:
    answered = []
    for _ in range(n):
        status, task = await predict(client, token, name, [1], no_cache=True, **options)
        assert status == 200 and task["status"] == "succeeded", task
        answered.append(task["outputs"][0])
    return answered


async def test_a_canary_takes_its_weight_and_promotion_moves_everything(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await publish(client, tokens.acme, "double", TRIPLE, "double:predict")
        await deploy(client, tokens.acme, name="dbl", model="double:1", replicas=1)
        await until_serving(client, tokens.acme, "dbl", 1)
        view = await set_canary(client, tokens.acme, "dbl", model="double:2", weight=50)
        assert view["version"] == 1
        assert (view["canary"]["version"], view["canary"]["weight"]) == (2, 50)
        assert view["canary"]["model"] == "acme/double:2"
        await canary_serving(client, tokens.acme, "dbl")
        # Half and half, by chance: 40 requests all to one version is a 1 in 2^39 event.
        split = await outputs(client, tokens.acme, "dbl", 40)
        assert set(split) == {2, 3}, split
        # All to the canary, on the direct path and the queue's (claimed by its replica only).
        await set_canary(client, tokens.acme, "dbl", model="double:2", weight=100)
        assert await outputs(client, tokens.acme, "dbl", 5) == [3] * 5
        status, queued = await predict(client, tokens.acme, "dbl", [4], **{"async": True})
        assert status == 202

        done: dict[str, Any] = {}

        async def ran() -> bool:
            nonlocal done
            response = await client.get(f"/v1/tasks/{queued['task_id']}", headers=auth(tokens.acme))
            done = await response.json()
            return bool(done["status"] == "succeeded")

        await eventually(ran, seconds=30)
        assert done["outputs"] == [12]
        assert (
            await pool.fetchval(
                "SELECT version FROM serving_tasks WHERE task_id = $1::uuid", queued["task_id"]
            )
            == 2
        )
        # Each version's answers memoized under its own: the canary's, then the stable one's.
        status, first = await predict(client, tokens.acme, "dbl", [7])
        assert (status, first["outputs"], first["memo"]) == (200, [21], "miss")
        await set_canary(client, tokens.acme, "dbl", model="double:2", weight=0)
        status, stable = await predict(client, tokens.acme, "dbl", [7])
        assert (status, stable["outputs"], stable["memo"]) == (200, [14], "miss")
        await set_canary(client, tokens.acme, "dbl", model="double:2", weight=100)
        status, again = await predict(client, tokens.acme, "dbl", [7])
        assert (status, again["outputs"], again["memo"]) == (200, [21], "hit")
        # Promoted: version 2 is the deployment's, the canary's replica its, the old one gone.
        canary_job = (await canary_serving(client, tokens.acme, "dbl"))["canary"]["replica_jobs"]
        response = await client.post(
            "/v1/deployments/dbl/canary/promote", headers=auth(tokens.acme)
        )
        assert response.status == 200, await response.text()
        promoted = await response.json()
        assert (promoted["version"], promoted["canary"]) == (2, None)
        assert [r["job_id"] for r in promoted["replica_jobs"]] == [canary_job[0]["job_id"]]
        assert await outputs(client, tokens.acme, "dbl", 5) == [3] * 5
        moves = [
            (e["event"], e["data"].get("weight")) for e in await history(client, tokens.acme, "dbl")
        ]
        assert moves == [
            ("CanaryStarted", 50),
            ("CanaryWeightSet", 100),
            ("CanaryWeightSet", 0),
            ("CanaryWeightSet", 100),
            ("CanaryPromoted", None),
        ]
        # No canary left to promote or roll back.
        response = await client.delete("/v1/deployments/dbl/canary", headers=auth(tokens.acme))
        assert response.status == 409, await response.text()


async def test_a_failing_canary_rolls_back_by_itself_and_says_why(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await publish(client, tokens.acme, "double", FAILING, "double:predict")
        await deploy(
            client, tokens.acme, name="dbl", model="double:1", replicas=1, serving={"memo": False}
        )
        await until_serving(client, tokens.acme, "dbl", 1)
        rule = {"max_error_rate": 0.5, "min_requests": 3, "window_s": 60}
        await set_canary(client, tokens.acme, "dbl", model="double:2", weight=100, rollback=rule)
        await canary_serving(client, tokens.acme, "dbl")
        for _ in range(4):
            status, task = await predict(client, tokens.acme, "dbl", [1])
            assert status == 200 and task["status"] == "failed", task

        entry: dict[str, Any] = {}

        async def rolled_back() -> bool:
            nonlocal entry
            entry = (await history(client, tokens.acme, "dbl"))[-1]
            return bool(entry["event"] == "CanaryRolledBack")

        await eventually(rolled_back, seconds=30)
        assert entry["actor"] == "system:canary"
        data = entry["data"]
        assert data["version"] == 2 and data["finished"] >= 3
        assert data["failed"] == data["finished"] and data["window_s"] == 60
        assert "error rate 1.000" in data["reason"]
        response = await client.get("/v1/deployments/dbl", headers=auth(tokens.acme))
        assert (await response.json())["canary"] is None

        # Every request to the stable version again, once this process's route is renewed (the
        # controller moved it: a route is at most ROUTE_FRESH_S old when a request takes it).
        async def stable() -> bool:
            status, task = await predict(client, tokens.acme, "dbl", [1])
            return bool(status == 200 and task.get("outputs") == [2])

        await eventually(stable, seconds=10)
        assert await outputs(client, tokens.acme, "dbl", 5) == [2] * 5
        assert [e["event"] for e in await history(client, tokens.acme, "dbl")] == [
            "CanaryStarted",
            "CanaryRolledBack",
        ]


async def test_bad_canaries_are_refused_naming_the_field_and_change_nothing(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path, agents=0) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await publish(client, tokens.acme, "double", TRIPLE, "double:predict")
        await publish(client, tokens.acme, "other", TRIPLE, "other:predict")
        await publish(client, tokens.globex, "secret", TRIPLE, "secret:predict")
        await deploy(client, tokens.acme, name="dbl", model="double:1", replicas=0)
        path = "/v1/deployments/dbl/canary"
        bad: list[tuple[dict[str, Any], int, str]] = [
            ({"model": "double:2", "weight": 101}, 422, "weight"),
            ({"model": "double:2", "weight": -1}, 422, "weight"),
            ({"model": "double:2"}, 422, "weight"),
            ({"model": "double:2", "weight": 5, "replicas": 0}, 422, "replicas"),
            (
                {"model": "double:2", "weight": 5, "rollback": {"max_error_rate": 1.5}},
                422,
                "rollback.max_error_rate",
            ),
            (
                {
                    "model": "double:2",
                    "weight": 5,
                    "rollback": {"max_error_rate": 0.1, "min_requests": 0},
                },
                422,
                "rollback.min_requests",
            ),
            ({"model": "double:1", "weight": 5}, 422, "model"),  # its own version
            ({"model": "other:1", "weight": 5}, 422, "model"),  # another model
            ({"model": "double:9", "weight": 5}, 404, "model"),
            ({"model": "globex/secret:1", "weight": 5}, 404, "model"),  # not the tenant's
        ]
        for body, status, field in bad:
            response = await client.put(path, json=body, headers=auth(tokens.acme))
            assert response.status == status, (body, await response.text())
            assert field in await response.text(), (body, await response.text())
        # Another tenant cannot canary (or see) acme's deployment.
        body = {"model": "double:2", "weight": 5}
        response = await client.put(path, json=body, headers=auth(tokens.globex))
        assert response.status == 404, await response.text()
        response = await client.get("/v1/deployments/dbl", headers=auth(tokens.acme))
        assert (await response.json())["canary"] is None
        assert await history(client, tokens.acme, "dbl") == []
