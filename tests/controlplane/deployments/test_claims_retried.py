"""A replica's claim tried again with its token after its answer was lost: the commit went
through on a primary that died before answering, and the standby promoted has it (found by
`trainyard bench failover`, docs/failover.md). The retry gets what the lost try took, not
more: otherwise that stays running under a replica that never runs it, until the lifecycle
manager replaces the replica for holding it past its timeout. On a real Postgres, with the
very statements the agent runs (node_agent/serving.py, node_agent/inference.py)."""

from __future__ import annotations

import json
from uuid import UUID, uuid4

import asyncpg

from controlplane.queries import Q

TENANT = "acme"
DEPLOYMENT = "mlp"


async def queue_task(owner: asyncpg.Connection) -> UUID:
    task_id = uuid4()
    await owner.execute(
        "INSERT INTO serving_tasks (task_id, tenant, steps, deployment, items, input, state,"
        " memo, submitted_at)"
        " VALUES ($1, $2, ARRAY[$3], $3, 1, '[1]', 'queued', 'off', clock_timestamp())",
        task_id,
        TENANT,
        DEPLOYMENT,
    )
    return task_id


async def claim_tasks(
    owner: asyncpg.Connection, claim: UUID, replica: UUID, known: list[UUID]
) -> list[UUID]:
    rows = await owner.fetch(Q["claim_tasks"], TENANT, DEPLOYMENT, 1, claim, replica, known)
    return [row["task_id"] for row in rows]


async def test_a_task_claim_tried_again_gets_the_tasks_its_lost_answer_took(
    owner: asyncpg.Connection,
) -> None:
    first, second = await queue_task(owner), await queue_task(owner)
    claim, replica = uuid4(), uuid4()
    assert await claim_tasks(owner, claim, replica, []) == [first]  # its answer is lost
    # Tried again, knowing of no task: the one it took, and no other.
    assert await claim_tasks(owner, claim, replica, []) == [first]
    assert await owner.fetchval("SELECT state FROM serving_tasks WHERE task_id = $1", second) == (
        "queued"
    )
    # Filling its batch, knowing of the first: the next one.
    assert await claim_tasks(owner, claim, replica, [first]) == [second]
    # Another batch's claim takes none of them.
    assert await claim_tasks(owner, uuid4(), replica, []) == []
    tries = await owner.fetch("SELECT tries FROM serving_tasks ORDER BY submitted_at")
    assert [row["tries"] for row in tries] == [1, 1]


async def test_a_query_claim_tried_again_gets_the_query_its_lost_answer_took(
    owner: asyncpg.Connection,
) -> None:
    job_id, replica = uuid4(), uuid4()
    await owner.execute(
        Q["insert_inference_job"],
        job_id,
        TENANT,
        f"inference-{job_id.hex[:16]}",
        1.0,
        4,
        None,
        json.dumps({"generate": {"shape": [2], "seed": 0}}),
    )

    async def claim_query(claim: UUID) -> tuple[int | None, str]:
        row = await owner.fetchrow(Q["claim_query"], job_id, replica, claim, "n1", 3.0)
        assert row is not None
        return row["index"], row["outcome"]

    claim = uuid4()
    assert await claim_query(claim) == (0, "claimed")  # its answer is lost
    assert await claim_query(claim) == (0, "claimed")  # tried again: the same query
    assert await owner.fetchval("SELECT started FROM inference_jobs WHERE job_id = $1", job_id) == 1
    assert await claim_query(uuid4()) == (1, "claimed")  # the next claim: the next query
    tries = await owner.fetch(
        "SELECT index, tries FROM inference_queries WHERE job_id = $1 ORDER BY index", job_id
    )
    assert [(row["index"], row["tries"]) for row in tries] == [(0, 1), (1, 1)]
