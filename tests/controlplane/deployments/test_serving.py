"""Serving end to end, on a real Postgres, through the HTTP API, with real replicas (the
process runtime) fed by a real agent: deploy, predict synchronously and asynchronously,
batching bounds, memoization, pipelines, failures in the tenant's code, and tenancy."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.controlplane.deployments.serving import (
    deploy,
    predict,
    publish,
    serving_cluster,
    until_serving,
)
from tests.tenancy import Tokens, auth

DOUBLE = b"def predict(batch):\n    return [x * 2 for x in batch]\n"
FAILING = b"def predict(batch):\n    return [1 / (x - x) for x in batch]\n"


async def test_a_deployment_answers_synchronously(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        view = await deploy(client, tokens.acme, name="dbl", model="double", replicas=1)
        assert view["model"] == "acme/double:1"
        await until_serving(client, tokens.acme, "dbl", 1)
        status, task = await predict(client, tokens.acme, "dbl", [1, 2, 3])
        assert status == 200, task
        assert task["status"] == "succeeded"
        assert task["outputs"] == [2, 4, 6]
        assert task["memo"] == "miss"
        times = task["times"]
        assert times["request_ms"] >= times["invocation_ms"] >= times["inference_ms"] >= 0
        # The same input again: the memo answers, without a replica.
        status, again = await predict(client, tokens.acme, "dbl", [1, 2, 3])
        assert (status, again["outputs"], again["memo"]) == (200, [2, 4, 6], "hit")
        assert again["times"]["invocation_ms"] is None
        # ...unless the request says not to.
        status, fresh = await predict(client, tokens.acme, "dbl", [1, 2, 3], no_cache=True)
        assert (status, fresh["outputs"], fresh["memo"]) == (200, [2, 4, 6], "off")
        # Another tenant sees none of it.
        response = await client.get("/v1/deployments/dbl", headers=auth(tokens.globex))
        assert response.status == 404
        status, _ = await predict(client, tokens.globex, "dbl", [1])
        assert status == 404
        response = await client.get(f"/v1/tasks/{task['task_id']}", headers=auth(tokens.globex))
        assert response.status == 404


async def test_async_tasks_and_failures_in_the_tenants_code(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "failing", FAILING, "failing:predict")
        await deploy(client, tokens.acme, name="bad", model="failing")
        await until_serving(client, tokens.acme, "bad", 1)
        status, queued = await predict(client, tokens.acme, "bad", [5], **{"async": True})
        assert status == 202
        assert queued["status"] == "queued"
        async with asyncio.timeout(30):
            while True:
                response = await client.get(
                    f"/v1/tasks/{queued['task_id']}", headers=auth(tokens.acme)
                )
                task = await response.json()
                if task["status"] in ("succeeded", "failed"):
                    break
                await asyncio.sleep(0.05)
        assert task["status"] == "failed"
        assert "ZeroDivisionError" in task["error"]
        assert "Traceback" in task["error"]
