"""Serving end to end, on a real Postgres, through the HTTP API, with real replicas (the
process runtime) fed by a real agent: deploy, predict synchronously and asynchronously,
batching bounds, memoization, pipelines, failures in the tenant's code, and tenancy."""

from __future__ import annotations

import asyncio
import json
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
from tests.polling import eventually
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


SIZES = b"def predict(batch):\n    return [len(batch)] * len(batch)\n"
"""Each output is the size of the batch its item was in: what the batcher did, seen by the model."""


async def wait_done(
    client: Client, token: str, task_id: str, seconds: float = 30
) -> dict[str, Any]:
    async with asyncio.timeout(seconds):
        while True:
            response = await client.get(f"/v1/tasks/{task_id}", headers=auth(token))
            task: dict[str, Any] = await response.json()
            if task["status"] in ("succeeded", "failed"):
                return task
            await asyncio.sleep(0.05)


async def test_batches_never_exceed_max_batch_size_counted_in_items(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "sizes", SIZES, "sizes:predict")
        serving = {"max_batch_size": 4, "max_wait_ms": 300, "memo": False}
        await deploy(client, tokens.acme, name="sizes", model="sizes", serving=serving)
        await until_serving(client, tokens.acme, "sizes", 1)
        # Tasks of 1, 2 and 3 items, and one of 6 (more than a batch: run in calls of 4 and 2).
        inputs = [[0], [0, 0], [0, 0, 0], [0] * 6, [0], [0, 0], [0]]
        queued = await asyncio.gather(
            *(predict(client, tokens.acme, "sizes", items, **{"async": True}) for items in inputs)
        )
        done = [await wait_done(client, tokens.acme, body["task_id"]) for _, body in queued]
        assert all(task["status"] == "succeeded" for task in done), done
        for items, task in zip(inputs, done, strict=True):
            assert len(task["outputs"]) == len(items)
            assert all(1 <= size <= 4 for size in task["outputs"]), task
        response = await client.get("/v1/deployments/sizes/metrics", headers=auth(tokens.acme))
        figures = await response.json()
        batches = figures["batches"]
        assert batches["items"] == sum(len(items) for items in inputs)
        assert batches["full"] + batches["timeout"] == batches["count"]
        assert batches["full"] >= 1  # seven tasks of 16 items came at once
        assert batches["max_size"] <= 4  # the task of 6 is two batches, as it is two calls
        assert figures["requests"] == len(inputs) and figures["succeeded"] == len(inputs)
        assert figures["memo"]["hits"] == 0 and figures["queue_depth"] == 0
        # The same figures, re-derived by an auditor from the audit views.
        conn = await asyncpg.connect(db_url)
        try:
            audited = await conn.fetchrow(
                "SELECT count(*) AS batches, sum(items) AS items,"
                " count(*) FILTER (WHERE reason = 'full') AS full"
                " FROM audit.serving_batches WHERE tenant = 'acme' AND deployment = 'sizes'"
            )
            runs = await conn.fetch(
                "SELECT runs FROM audit.serving_tasks"
                " WHERE tenant = 'acme' AND deployment = 'sizes'"
            )
        finally:
            await conn.close()
        assert (audited["batches"], audited["items"], audited["full"]) == (
            batches["count"],
            batches["items"],
            batches["full"],
        )
        assert [r["runs"] for r in runs] == [1] * len(inputs)


SIZES_BUT_ONES = (
    b"def predict(batch):\n"
    b"    if 1 in batch:\n"
    b"        raise ValueError('a one')\n"
    b"    return [len(batch)] * len(batch)\n"
)
"""As SIZES, failing a call that holds a 1."""


async def test_a_task_larger_than_a_batch_is_recorded_as_one_batch_per_call(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "sizes", SIZES_BUT_ONES, "sizes:predict")
        serving = {"max_batch_size": 4, "max_wait_ms": 0, "memo": False}
        await deploy(client, tokens.acme, name="sizes", model="sizes", serving=serving)
        await until_serving(client, tokens.acme, "sizes", 1)
        status, task = await predict(client, tokens.acme, "sizes", [0] * 7)
        assert (status, task["outputs"]) == (200, [4] * 4 + [3] * 3)
        # Counted off the request's path: reading the figures waits for this process's counts.
        await client.get("/v1/deployments/sizes/metrics", headers=auth(tokens.acme))
        batches = await pool.fetch(
            "SELECT batch_id, items, tasks, outcome, inference_ms FROM serving_batches"
            " WHERE deployment = 'sizes' ORDER BY at, items DESC"
        )
        assert [(b["items"], b["tasks"], b["outcome"]) for b in batches] == [
            (4, 1, "succeeded"),
            (3, 0, "succeeded"),  # the task is counted once, by its first call
        ]
        assert all(b["inference_ms"] is not None for b in batches)
        assert task["times"]["steps"][0]["batch"] == str(batches[0]["batch_id"])
        response = await client.get("/v1/deployments/sizes/metrics", headers=auth(tokens.acme))
        figures = (await response.json())["batches"]
        assert (figures["count"], figures["items"], figures["max_size"]) == (2, 7, 4)
        # A call that fails fails the task; each call, the failed one too, is still a batch.
        status, failed = await predict(client, tokens.acme, "sizes", [0] * 4 + [1] + [0] * 5)
        assert (status, failed["status"]) == (200, "failed")
        await client.get("/v1/deployments/sizes/metrics", headers=auth(tokens.acme))
        calls = await pool.fetch(
            "SELECT items, inference_ms IS NULL AS unanswered FROM serving_batches"
            " WHERE deployment = 'sizes' AND outcome = 'failed'"
        )
        # Run, failed, and never made: the items of a failed call go with it.
        assert sorted(tuple(c) for c in calls) == [(2, True), (4, False), (4, True)]


ADD1 = b"def predict(batch):\n    return [x + 1 for x in batch]\n"
SQUARE = b"def predict(batch):\n    return [x * x for x in batch]\n"


async def test_a_pipeline_of_three_steps_is_one_task_with_each_steps_times(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        for name, source in (("add1", ADD1), ("double", DOUBLE), ("square", SQUARE)):
            await publish(client, tokens.acme, name, source, f"{name}:predict")
            await deploy(client, tokens.acme, name=name, model=name)
        for name in ("add1", "double", "square"):
            await until_serving(client, tokens.acme, name, 1)
        steps = ["add1", "double", "square"]
        response = await client.post(
            "/v1/pipelines", json={"name": "p", "steps": steps}, headers=auth(tokens.acme)
        )
        assert response.status == 201, await response.text()
        # The same definition again changes nothing (it wrote nothing: no 500 for an empty
        # append); other steps under the name are a conflict.
        for again, status in ((steps, 201), (["add1"], 409)):
            response = await client.post(
                "/v1/pipelines", json={"name": "p", "steps": again}, headers=auth(tokens.acme)
            )
            assert response.status == status, await response.text()
        response = await client.post(
            "/v1/pipelines/p/predict", json={"inputs": [1, 2]}, headers=auth(tokens.acme)
        )
        task = await response.json()
        assert response.status == 200, task
        assert task["outputs"] == [16, 36]  # ((x + 1) * 2) ** 2
        assert [step["deployment"] for step in task["times"]["steps"]] == steps
        assert task["pipeline"] == "p" and task["step"] == 2
        # A pipeline names deployments that exist: one that does not is not found.
        response = await client.post(
            "/v1/pipelines", json={"name": "q", "steps": ["nope"]}, headers=auth(tokens.acme)
        )
        assert response.status == 404
        assert (await response.json())["field"] == "steps.0"


async def test_scaling_up_and_down_and_deleting(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await deploy(client, tokens.acme, name="dbl", model="double", replicas=1)
        first = await until_serving(client, tokens.acme, "dbl", 1)
        response = await client.patch(
            "/v1/deployments/dbl", json={"replicas": 2}, headers=auth(tokens.acme)
        )
        assert response.status == 200
        view = await until_serving(client, tokens.acme, "dbl", 2)
        assert view["replica_jobs"][0]["job_id"] == first["replica_jobs"][0]["job_id"]
        response = await client.patch(
            "/v1/deployments/dbl", json={"replicas": 1}, headers=auth(tokens.acme)
        )
        view = await response.json()
        # The newest replica goes; the first keeps serving.
        assert [r["job_id"] for r in view["replica_jobs"]] == [first["replica_jobs"][0]["job_id"]]
        status, task = await predict(client, tokens.acme, "dbl", [21])
        assert (status, task["outputs"]) == (200, [42])
        response = await client.delete("/v1/deployments/dbl", headers=auth(tokens.acme))
        assert (await response.json())["state"] == "deleting"

        async def gone() -> bool:
            response = await client.get("/v1/deployments/dbl", headers=auth(tokens.acme))
            return response.status == 404

        await eventually(gone, seconds=30)
        status, _ = await predict(client, tokens.acme, "dbl", [1])
        assert status == 404
        response = await client.get(
            f"/v1/jobs/{first['replica_jobs'][0]['job_id']}", headers=auth(tokens.acme)
        )
        assert (await response.json())["state"] == "CANCELLED"


async def test_bad_requests_change_nothing(db_url: str, tmp_path: Path, tokens: Tokens) -> None:
    async with serving_cluster(db_url, tmp_path, agents=0) as (client, _):
        bad = [
            ({"name": "Bad Name", "model": "x"}, 422),
            ({"name": "d", "model": "no-such-model"}, 404),
            ({"name": "d", "model": "x", "replicas": -1}, 422),
            ({"name": "d", "model": "x", "surprise": 1}, 422),
            ({"name": "d", "model": "x", "serving": {"max_batch_size": 0}}, 422),
            ({"name": "d", "model": "x", "replicas": 10**30}, 422),
            ({"name": "d", "model": "x", "serving": {"memo_max_entries": 2**63}}, 422),
            ({"name": "d" * 64, "model": "x"}, 422),
            ({"name": "d", "model": "../../etc/passwd"}, 422),
        ]
        for body, status in bad:
            response = await client.post("/v1/deployments", json=body, headers=auth(tokens.acme))
            assert response.status == status, (body, await response.text())
        response = await client.get("/v1/deployments", headers=auth(tokens.acme))
        assert (await response.json())["items"] == []
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        # An image the operator does not allow: refused at once, not at every replica's start.
        resources = {"image": "elsewhere.example/miner:latest"}
        body = {"name": "dbl", "model": "double", "resources": resources}
        response = await client.post("/v1/deployments", json=body, headers=auth(tokens.acme))
        assert response.status == 422
        assert (await response.json())["field"] == "resources.image"
        await deploy(client, tokens.acme, name="dbl", model="double", replicas=0)
        hostile = (
            {"inputs": []},
            {"inputs": "x"},
            {},
            {"inputs": [1], "async": "maybe"},
            {"inputs": ["a\u0000b"]},  # jsonb holds no NUL
            {"inputs": [{"k": ["\ud800"]}]},  # nor a lone surrogate
            {"inputs": [0] * 5000},  # more items than a task may carry
        )
        for raw in hostile:
            response = await client.post(
                "/v1/deployments/dbl/predict",
                data=json.dumps(raw, ensure_ascii=True).replace("\\\\", "\\"),
                headers={**auth(tokens.acme), "Content-Type": "application/json"},
            )
            assert response.status == 422, (raw, await response.text())
        response = await client.get("/v1/deployments/dbl/metrics", headers=auth(tokens.acme))
        assert (await response.json())["requests"] == 0  # none of them wrote a task
        response = await client.post(
            "/v1/deployments/dbl/predict", data=b"{not json", headers=auth(tokens.acme)
        )
        assert response.status == 400
        response = await client.get("/v1/tasks/not-a-uuid", headers=auth(tokens.acme))
        assert response.status == 404
        # Another tenant's model is not found, and a public one would be named tenant/name.
        response = await client.post(
            "/v1/deployments",
            json={"name": "d", "model": "acme/double"},
            headers=auth(tokens.globex),
        )
        assert response.status == 404


async def test_an_idempotent_prediction_is_one_task_however_often_it_is_sent(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await deploy(client, tokens.acme, name="dbl", model="double", serving={"memo": False})
        await deploy(client, tokens.acme, name="other", model="double", replicas=0)
        await until_serving(client, tokens.acme, "dbl", 1)
        headers = {**auth(tokens.acme), "Idempotency-Key": "order-17"}
        answers = await asyncio.gather(
            *(
                client.post("/v1/deployments/dbl/predict", json={"inputs": [4]}, headers=headers)
                for _ in range(3)
            )
        )
        tasks = [await answer.json() for answer in answers]
        assert {task["task_id"] for task in tasks} == {tasks[0]["task_id"]}
        done = await wait_done(client, tokens.acme, tasks[0]["task_id"])
        assert done["outputs"] == [8]
        figures = await (
            await client.get("/v1/deployments/dbl/metrics", headers=auth(tokens.acme))
        ).json()
        assert figures["requests"] == 1
        response = await client.post(
            "/v1/deployments/other/predict", json={"inputs": [4]}, headers=headers
        )
        assert response.status == 409
        assert (await response.json())["field"] == "Idempotency-Key"


async def test_the_memo_keeps_its_most_recently_used_results_and_metrics_count_it(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        serving = {"memo": True, "memo_max_entries": 2, "max_wait_ms": 0}
        await deploy(client, tokens.acme, name="dbl", model="double", serving=serving)
        await until_serving(client, tokens.acme, "dbl", 1)
        for value in (1, 2, 3):  # three misses: three results stored, one over the bound
            status, task = await predict(client, tokens.acme, "dbl", [value])
            assert (status, task["memo"]) == (200, "miss")
        status, task = await predict(client, tokens.acme, "dbl", [3])
        assert (status, task["memo"]) == (200, "hit")

        async def bounded() -> bool:
            response = await client.get("/v1/deployments/dbl/metrics", headers=auth(tokens.acme))
            return bool((await response.json())["memo"]["entries"] == 2)

        await eventually(bounded)  # the lifecycle manager's next sweep evicts the oldest
        status, task = await predict(client, tokens.acme, "dbl", [1])
        assert (status, task["memo"], task["outputs"]) == (200, "miss", [2])
        response = await client.get("/v1/deployments/dbl/metrics", headers=auth(tokens.acme))
        figures = await response.json()
        assert (figures["memo"]["hits"], figures["memo"]["misses"]) == (1, 4)
        response = await client.get("/metrics", headers=auth(tokens.admin))
        text = await response.text()
        assert 'trainyard_serving_queue_depth{deployment="dbl",tenant="acme"} 0' in text
        assert 'trainyard_serving_batch_size{deployment="dbl",tenant="acme"} 1' in text
