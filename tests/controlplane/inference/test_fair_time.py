"""Fair time between inference jobs, on a real Postgres with real agents and replicas: jobs
running together get query throughput in proportion to their weights, also when one
model is three times slower than the other, and a job submitted later starts at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from uuid import UUID

import asyncpg

from tests.controlplane.deployments.serving import publish, serving_cluster
from tests.controlplane.inference.test_inference import submit, until_state
from tests.polling import eventually
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


VERY_SLOW = (
    b"import time\n\ndef predict(batch):\n    time.sleep(4)\n    return [0 for _ in batch]\n"
)


async def test_a_job_whose_queries_outlast_the_presence_window_keeps_its_share(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    """A replica busy with a query longer than PRESENT_S asks for none meanwhile; it still says
    it is there, so the other job does not run ahead of it."""
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "very-slow", VERY_SLOW, "very_slow:predict")
        await publish(client, tokens.acme, "fast", FAST, "fast:predict")
        common = {"input": {"generate": {"shape": [2]}}, "batch_size": 1}
        slow = await submit(client, tokens.acme, name="slow", model="very-slow", **common)
        fast = await submit(client, tokens.acme, name="fast", model="fast", **common)
        conn = await asyncpg.connect(db_url)
        try:

            async def started() -> dict[UUID, int]:
                rows = await conn.fetch("SELECT job_id, started FROM inference_jobs")
                return {row["job_id"]: row["started"] for row in rows}

            async def both_running() -> bool:
                counts = await started()
                return len(counts) == 2 and all(counts.values())

            # Counted from when both take queries: the first to load runs alone until then.
            await eventually(both_running, seconds=60)
            before = await started()
            await asyncio.sleep(13)
            after = await started()
        finally:
            await conn.close()
        slow_id, fast_id = UUID(slow["id"]), UUID(fast["id"])
        slow_n = after[slow_id] - before[slow_id]
        fast_n = after[fast_id] - before[fast_id]
        assert slow_n >= 3, (before, after)
        # At any instant the fast job is at most one query ahead of the slow one, and behind
        # by one for the moment after the slow one starts a query: deltas differ by 2 at most.
        assert fast_n <= slow_n + 2, (slow_n, fast_n)
