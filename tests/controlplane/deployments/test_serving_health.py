"""A replica that stops answering is replaced even though its process lives: the lifecycle
manager sees a task held past its deployment's timeout, gives it back to the queue (failing it
after its last try), stops the replica's job and starts another."""

from __future__ import annotations

from pathlib import Path

from tests.controlplane.deployments.serving import (
    deploy,
    predict,
    publish,
    serving_cluster,
    until_serving,
)
from tests.controlplane.deployments.test_serving import wait_done
from tests.tenancy import Tokens, auth

HANGS = b"""import time

def predict(batch):
    if "hang" in batch:
        time.sleep(600)
    return batch
"""


async def test_an_unresponsive_replica_is_replaced_and_its_task_fails_after_its_tries(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "hangs", HANGS, "hangs:predict")
        serving = {"task_timeout_s": 1.0, "max_wait_ms": 0, "memo": False}
        await deploy(client, tokens.acme, name="hangs", model="hangs", serving=serving)
        first = await until_serving(client, tokens.acme, "hangs", 1)
        status, queued = await predict(client, tokens.acme, "hangs", ["hang"], **{"async": True})
        assert status == 202
        task = await wait_done(client, tokens.acme, queued["task_id"], seconds=90)
        assert task["status"] == "failed"
        assert task["error"] == "no replica answered within 1s, in 3 tries"
        assert task["tries"] == 3
        # Each replica that held it was stopped (its process lived on, hanging) and replaced.
        replaced = first["replica_jobs"][0]["job_id"]
        response = await client.get(f"/v1/jobs/{replaced}", headers=auth(tokens.acme))
        assert (await response.json())["state"] == "CANCELLED"
        response = await client.get(f"/v1/jobs/{replaced}/history", headers=auth(tokens.acme))
        history = await response.json()
        assert "unresponsive" in str(history), history
        view = await until_serving(client, tokens.acme, "hangs", 1)
        assert view["replica_jobs"][0]["job_id"] != replaced
        status, ok = await predict(client, tokens.acme, "hangs", ["fine"])
        assert (status, ok["outputs"]) == (200, ["fine"])


KILLS = b"""import os

def predict(batch):
    if "poison" in batch:
        os._exit(3)
    return batch
"""


async def test_a_task_that_kills_its_replica_fails_alone_and_the_others_are_answered(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "kills", KILLS, "kills:predict")
        serving = {"max_batch_size": 8, "max_wait_ms": 200, "memo": False}
        await deploy(client, tokens.acme, name="kills", model="kills", serving=serving)
        await until_serving(client, tokens.acme, "kills", 1)
        # Sent together: the poison's first try shares a batch with the others.
        sent = []
        for item in ("poison", "a", "b", "c"):
            status, queued = await predict(client, tokens.acme, "kills", [item], **{"async": True})
            assert status == 202
            sent.append(queued["task_id"])
        poison, *fine = [await wait_done(client, tokens.acme, t, seconds=120) for t in sent]
        assert poison["status"] == "failed"
        assert poison["error"] == "its replica was lost while running it, 3 times"
        assert poison["tries"] == 3
        assert [(t["status"], t["outputs"]) for t in fine] == [
            ("succeeded", ["a"]),
            ("succeeded", ["b"]),
            ("succeeded", ["c"]),
        ]
