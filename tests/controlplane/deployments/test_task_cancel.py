"""A task cancelled by its owner (POST /v1/tasks/{id}/cancel), on a real Postgres with a real
replica: queued, no replica ever claims it; running, its replica finishes the call and the
result is fenced out; finished, 409; another tenant's, 404."""

from __future__ import annotations

import uuid
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
from tests.controlplane.deployments.test_direct_path import SLOW_SIZES
from tests.controlplane.deployments.test_serving import wait_done
from tests.polling import eventually
from tests.tenancy import Tokens, auth


async def status_of(client: Client, token: str, task_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/tasks/{task_id}", headers=auth(token))
    assert response.status == 200
    task: dict[str, Any] = await response.json()
    return task


async def cancel(client: Client, token: str, task_id: str) -> tuple[int, dict[str, Any]]:
    response = await client.post(f"/v1/tasks/{task_id}/cancel", headers=auth(token))
    body: dict[str, Any] = await response.json()
    return response.status, body


async def test_a_cancelled_task_is_never_run_or_its_result_never_delivered(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "slow", SLOW_SIZES, "slow:predict")
        serving = {"max_batch_size": 1, "max_wait_ms": 10, "memo": False}
        await deploy(client, tokens.acme, name="slow", model="slow", serving=serving)
        await until_serving(client, tokens.acme, "slow", 1)
        # One task in the replica's one-second call, one queued behind it.
        _, running = await predict(client, tokens.acme, "slow", [0], **{"async": True})
        _, queued = await predict(client, tokens.acme, "slow", [0, 0], **{"async": True})

        async def in_its_call() -> bool:
            task = await status_of(client, tokens.acme, running["task_id"])
            return bool(task["status"] == "running")

        await eventually(in_its_call)
        assert (await status_of(client, tokens.acme, queued["task_id"]))["status"] == "queued"

        # Another tenant's is not theirs to see or cancel; a malformed id is no task.
        assert (await cancel(client, tokens.globex, queued["task_id"]))[0] == 404
        assert (await cancel(client, tokens.acme, "not-a-uuid"))[0] == 404
        assert (await cancel(client, tokens.acme, str(uuid.uuid4())))[0] == 404

        for task in (queued, running):
            status, body = await cancel(client, tokens.acme, task["task_id"])
            assert (status, body["status"], body["error"]) == (
                200,
                "failed",
                "cancelled by its owner",
            )
        # A later request runs once the replica's call is over: the cancelled ones stay as
        # they were cancelled (the queued one never claimed, the running one's result fenced).
        _, later = await predict(client, tokens.acme, "slow", [0], **{"async": True})
        assert (await wait_done(client, tokens.acme, later["task_id"]))["outputs"] == [1]
        for task in (queued, running):
            row = await pool.fetchrow(
                "SELECT state, output, error, claimed_at FROM serving_tasks WHERE task_id = $1",
                uuid.UUID(task["task_id"]),
            )
            assert row is not None
            assert (row["state"], row["output"], row["error"]) == (
                "failed",
                None,
                "cancelled by its owner",
            )
        claimed = await pool.fetchval(
            "SELECT claimed_at FROM serving_tasks WHERE task_id = $1",
            uuid.UUID(queued["task_id"]),
        )
        assert claimed is None
        # Only the later task's call is a batch: the fenced one recorded nothing.
        assert await pool.fetchval("SELECT count(*) FROM serving_batches") == 1
        # Finished (cancelled, or succeeded): nothing left to cancel.
        for task in (queued, later):
            status, body = await cancel(client, tokens.acme, task["task_id"])
            assert status == 409, body
