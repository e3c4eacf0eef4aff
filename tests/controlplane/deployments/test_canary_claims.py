"""Which replica claims a canary's tasks, on a real Postgres: claim_tasks gives each replica only
its own version's tasks (replica_version), a retired replica none, and retarget_tasks sends a
task queued for a version no longer served to the deployment's own."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from uuid import UUID

import asyncpg

from controlplane.queries import Q


async def serving(pool: asyncpg.Pool, stable: UUID, canary: UUID) -> None:
    """acme's `dbl`: version 1 on `stable`, a canary of version 2 on `canary`."""
    await pool.execute(
        "INSERT INTO deployments (tenant, name, model_tenant, model_name, reference, version, "
        "artifact_sha256, entry_point, spec, replicas, replica_jobs, deleted, created_at, "
        "updated_at, canary_version, canary_weight, canary_jobs) "
        "VALUES ('acme', 'dbl', 'acme', 'double', 'double:1', 1, $1, 'double:predict', '{}', 1, "
        "$2, false, now(), now(), 2, 10, $3)",
        "1" * 64,
        [stable, canary],
        [canary],
    )


async def queued(pool: asyncpg.Pool, version: int | None) -> UUID:
    task_id = uuid.uuid4()
    await pool.execute(
        "INSERT INTO serving_tasks (task_id, tenant, steps, deployment, items, input, state, "
        "memo, submitted_at, version) "
        "VALUES ($1, 'acme', '{dbl}', 'dbl', 1, $2::jsonb, 'queued', 'off', now(), $3)",
        task_id,
        json.dumps([1]),
        version,
    )
    return task_id


async def claimed(pool: asyncpg.Pool, replica: UUID) -> set[UUID]:
    rows = await pool.fetch(Q["claim_tasks"], "acme", "dbl", 100, uuid.uuid4(), replica, [])
    return {row["task_id"] for row in rows}


async def test_each_replica_claims_only_its_own_versions_tasks(pool: asyncpg.Pool) -> None:
    stable, canary, retired = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await serving(pool, stable, canary)
    own, explicit, to_canary = (
        await queued(pool, None),
        await queued(pool, 1),
        await queued(pool, 2),
    )
    assert await claimed(pool, retired) == set()  # no longer the deployment's: takes nothing
    assert await claimed(pool, canary) == {to_canary}
    assert await claimed(pool, stable) == {own, explicit}


async def test_a_task_for_a_version_no_longer_served_goes_to_the_deployments_own(
    pool: asyncpg.Pool,
) -> None:
    stable, canary = uuid.uuid4(), uuid.uuid4()
    await serving(pool, stable, canary)
    stranded = await queued(pool, 2)
    await pool.execute(Q["retarget_tasks"])  # its canary still serves: it stays
    assert (
        await pool.fetchval("SELECT version FROM serving_tasks WHERE task_id = $1", stranded) == 2
    )
    # Rolled back (as the projection records it): the task is the stable version's now.
    await pool.execute(Q["end_canary"], "acme", "dbl", datetime.now(UTC))
    await pool.execute(Q["remove_replica"], "acme", "dbl", canary)
    await pool.execute(Q["retarget_tasks"])
    assert await claimed(pool, canary) == set()
    assert await claimed(pool, stable) == {stranded}
