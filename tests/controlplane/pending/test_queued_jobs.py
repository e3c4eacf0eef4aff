"""The recorder's queue rows made jobs once (`QueuedJobs`): a row that did not change since the
last round is the job made of it then; one that changed is made again; inference jobs, which
take no node, are left out; and a job no longer queued is forgotten."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from controlplane.pending.recorder import QueuedJobs

ROWS = """
SELECT job_id, 'acme' AS tenant, 'train' AS name, 1 AS attempt, 1 AS learners,
       gpus AS gpus_per_learner, 1.0::float8 AS cpus_per_learner,
       1024 AS memory_mb_per_learner, NULL::int AS learners_per_node, 0 AS priority,
       '2026-12-01T00:00:00Z'::timestamptz AS submitted_at, NULL::timestamptz AS not_before,
       inference, false AS allocated
FROM unnest($1::uuid[], $2::int[], $3::bool[]) AS q(job_id, gpus, inference)
"""

A, B, C = (UUID(int=k) for k in (1, 2, 3))


async def rows(pool: asyncpg.Pool, *jobs: tuple[UUID, int, bool]) -> list[asyncpg.Record]:
    ids, gpus, inference = zip(*jobs, strict=True)
    return list(await pool.fetch(ROWS, list(ids), list(gpus), list(inference)))


async def test_a_row_unchanged_is_the_job_made_before_and_a_changed_one_is_made_again(
    pool: asyncpg.Pool,
) -> None:
    made = QueuedJobs()
    first = made.of(await rows(pool, (A, 1, False), (B, 1, False), (C, 1, True)))
    assert [job.job_id for job in first] == [A, B]  # C, an inference job, takes no node
    # Read again (new records of the same values), B's demand changed, A's not.
    second = made.of(await rows(pool, (A, 1, False), (B, 2, False)))
    assert second[0] is first[0]
    assert second[1] is not first[1] and second[1].demand.gpus == 2


async def test_a_job_that_left_the_queue_is_forgotten(pool: asyncpg.Pool) -> None:
    made = QueuedJobs()
    first = made.of(await rows(pool, (A, 1, False), (B, 1, False)))
    assert [job.job_id for job in made.of(await rows(pool, (B, 1, False)))] == [B]
    # Back in the queue (a restart), A is made afresh, not taken from two rounds ago.
    again = made.of(await rows(pool, (A, 1, False), (B, 1, False)))
    assert again[0] is not first[0] and again[0] == first[0]
    assert again[1] is first[1]
