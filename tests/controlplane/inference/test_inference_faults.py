"""Inference jobs through failures, on a real Postgres with real agents and replicas: a replica
killed mid-query has its query run again elsewhere and recorded once; with no control plane
running, the agents go on taking and recording queries; a model that cannot load fails the
job, saying why; an inference job's deployment is its own."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import asyncpg

from harness.processes import replica_process
from tests.controlplane.deployments.serving import publish, serving_cluster
from tests.controlplane.inference.test_inference import SUMS, stats, submit, until_state
from tests.polling import eventually
from tests.tenancy import Tokens, auth

SLOW_SUMS = b"import time\n\n" + SUMS.replace(b"    return", b"    time.sleep(0.3)\n    return")
BROKEN = b"raise RuntimeError('this model cannot load')\n\ndef predict(batch):\n    return batch\n"


async def test_a_replica_killed_mid_query_costs_no_query(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path, agents=2) as (client, agents):
        await publish(client, tokens.acme, "slow-sums", SLOW_SUMS, "slow_sums:predict")
        job = await submit(
            client,
            tokens.acme,
            name="survives",
            model="slow-sums",
            input={"generate": {"shape": [4], "seed": 1}},
            batch_size=2,
            queries=30,
            replicas=2,
        )
        conn = await asyncpg.connect(db_url)
        try:

            async def held() -> asyncpg.Record | None:
                row: asyncpg.Record | None = await conn.fetchrow(
                    "SELECT index, replica, node FROM inference_queries"
                    " WHERE job_id = $1 AND state = 'running' LIMIT 1",
                    job["id"],
                )
                return row

            holding: asyncpg.Record | None = None

            async def found() -> bool:
                nonlocal holding
                holding = await held()
                return holding is not None

            await eventually(found, seconds=60)
            assert holding is not None
            [agent] = [a for a in agents if a.config.name == holding["node"]]
            pid = replica_process(agent.config.name, agent.config.work_dir, holding["replica"])
            os.kill(pid, signal.SIGKILL)
            await until_state(client, tokens.acme, job["id"], "COMPLETED")
            rows = await conn.fetch(
                "SELECT index, state, tries FROM inference_queries WHERE job_id = $1"
                " ORDER BY index",
                job["id"],
            )
        finally:
            await conn.close()
        assert [r["index"] for r in rows] == list(range(30))
        assert all(r["state"] == "succeeded" for r in rows)
        retried = {r["index"]: r["tries"] for r in rows if r["tries"] > 1}
        assert holding["index"] in retried, retried
        figures = await stats(client, tokens.acme, job["id"])
        assert figures["queries"]["finished"] == 30
        assert figures["queries"]["retried"] == len(retried)


async def test_queries_flow_while_no_control_plane_runs(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "sums", SUMS, "sums:predict")
        job = await submit(
            client,
            tokens.acme,
            name="on-its-own",
            model="sums",
            input={"generate": {"shape": [4]}},
            batch_size=2,
        )
        await until_state(client, tokens.acme, job["id"], "PROCESSING")
        await client.close()  # the control plane stops: API, manager, projections
        conn = await asyncpg.connect(db_url)
        try:
            count = (
                "SELECT count(*) FROM inference_queries WHERE job_id = $1 AND state = 'succeeded'"
            )
            before = await conn.fetchval(count, job["id"])
            await asyncio.sleep(2)
            after = await conn.fetchval(count, job["id"])
            assert after > before + 5, (before, after)
        finally:
            await conn.close()


async def test_a_model_that_cannot_load_fails_the_job(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "broken", BROKEN, "broken:predict")
        job = await submit(
            client,
            tokens.acme,
            name="doomed",
            model="broken",
            input={"generate": {"shape": [4]}},
        )
        failed = await until_state(client, tokens.acme, job["id"], "FAILED")
        assert "cannot load" in failed["failure_reason"], failed


async def test_an_inference_jobs_deployment_is_its_own(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path, agents=0) as (client, _):
        await publish(client, tokens.acme, "sums", SUMS, "sums:predict")
        job = await submit(
            client, tokens.acme, name="owned", model="sums", input={"generate": {"shape": [4]}}
        )
        name = f"inference-{job['id'].replace('-', '')[:16]}"
        response = await client.get(f"/v1/deployments/{name}", headers=auth(tokens.acme))
        view = await response.json()
        assert view.get("inference_job") == job["id"], view
        response = await client.patch(
            f"/v1/deployments/{name}", json={"replicas": 5}, headers=auth(tokens.acme)
        )
        assert response.status == 409, await response.text()
        assert job["id"] in (await response.json())["error"]
        response = await client.delete(f"/v1/deployments/{name}", headers=auth(tokens.acme))
        assert response.status == 409
        # Cancelling the job takes its deployment away.
        response = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(tokens.acme))
        assert response.status == 200

        async def gone() -> bool:
            response = await client.get(f"/v1/deployments/{name}", headers=auth(tokens.acme))
            return response.status == 404

        await eventually(gone, seconds=30)


HANGS_ON_ZERO = (
    b"import time\n\n"
    b"def predict(batch):\n"
    b"    if batch[0] == 0:\n"
    b"        time.sleep(3600)\n"
    b"    return batch\n"
)


async def test_a_replica_hanging_on_a_query_is_replaced_and_the_query_fails_after_three_tries(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "hangs", HANGS_ON_ZERO, "hangs:predict")
        job = await submit(
            client,
            tokens.acme,
            name="hung",
            model="hangs",
            input={"items": [0, 1, 2]},
            batch_size=1,
            query_timeout_s=1,
        )
        # Query 0 hangs each time; queries 1 and 2 run on the replicas that replace the hung.
        done = await until_state(client, tokens.acme, job["id"], "COMPLETED")
        assert done["state"] == "COMPLETED"
        response = await client.get(f"/v1/jobs/{job['id']}/queries", headers=auth(tokens.acme))
        queries = (await response.json())["queries"]
        assert [q["state"] for q in queries] == ["failed", "succeeded", "succeeded"]
        assert queries[0]["tries"] == 3
        assert "no replica answered within 1s, in 3 tries" in queries[0]["error"]
        assert [q["outputs"] for q in queries[1:]] == [[1], [2]]


KILLS_ON_ZERO = (
    b"import os\n\n"
    b"def predict(batch):\n"
    b"    if batch[0] == 0:\n"
    b"        os._exit(3)\n"
    b"    return batch\n"
)


async def test_a_query_that_kills_its_replica_fails_after_three_tries_and_the_job_goes_on(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "poison", KILLS_ON_ZERO, "poison:predict")
        job = await submit(
            client,
            tokens.acme,
            name="poisoned",
            model="poison",
            input={"items": [0, 1, 2]},
            batch_size=1,
        )
        await until_state(client, tokens.acme, job["id"], "COMPLETED")
        response = await client.get(f"/v1/jobs/{job['id']}/queries", headers=auth(tokens.acme))
        queries = (await response.json())["queries"]
        assert [q["state"] for q in queries] == ["failed", "succeeded", "succeeded"]
        assert queries[0]["tries"] == 3
        assert "its replica was lost while running it, 3 times" in queries[0]["error"]
