"""Fair time between inference jobs, on a real Postgres with real agents and replicas: jobs
running together get query throughput in proportion to their weights, also when one
model is three times slower than the other, and a job submitted later starts at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg

from tests.controlplane.deployments.serving import publish, serving_cluster
from tests.controlplane.inference.test_inference import submit, until_state
from tests.tenancy import Tokens, auth

SLOW = b"import time\n\ndef predict(batch):\n    time.sleep(0.06)\n    return [0 for _ in batch]\n"
FAST = b"import time\n\ndef predict(batch):\n    time.sleep(0.02)\n    return [1 for _ in batch]\n"
ENDLESS = {"input": {"generate": {"shape": [2]}}, "batch_size": 2, "replicas": 2}


async def finished_between(conn: asyncpg.Connection, job_id: str, start: float, end: float) -> int:
    count: int = await conn.fetchval(
        "SELECT count(*) FROM inference_queries WHERE job_id = $1 AND finished_at"
        " BETWEEN to_timestamp($2) AND to_timestamp($3)",
        job_id,
        start,
        end,
    )
    return count


async def test_throughput_follows_the_weights_whatever_the_models_speed(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path, agents=2) as (client, _):
        await publish(client, tokens.acme, "slow", SLOW, "slow:predict")
        await publish(client, tokens.acme, "fast", FAST, "fast:predict")
        conn = await asyncpg.connect(db_url)
        try:
            for weights in ((1.0, 1.0), (2.0, 1.0)):
                slow = await submit(
                    client, tokens.acme, name="slow", model="slow", weight=weights[0], **ENDLESS
                )
                await until_state(client, tokens.acme, slow["id"], "PROCESSING")
                fast = await submit(
                    client, tokens.acme, name="fast", model="fast", weight=weights[1], **ENDLESS
                )
                await until_state(client, tokens.acme, fast["id"], "PROCESSING")
                await asyncio.sleep(2)  # both replicas of each asking
                start = await conn.fetchval("SELECT extract(epoch FROM now())::float8")
                await asyncio.sleep(8)
                end = start + 8
                slow_n = await finished_between(conn, slow["id"], start, end)
                fast_n = await finished_between(conn, fast["id"], start, end)
                ratio = (slow_n / weights[0]) / (fast_n / weights[1])
                print(f"weights {weights}: slow {slow_n}, fast {fast_n}, ratio {ratio:.3f}")
                assert abs(ratio - 1) <= 0.15, (weights, slow_n, fast_n)
                for job in (slow, fast):
                    response = await client.post(
                        f"/v1/jobs/{job['id']}/cancel", headers=auth(tokens.acme)
                    )
                    assert response.status == 200
                    await until_state(client, tokens.acme, job["id"], "CANCELLED")
        finally:
            await conn.close()
