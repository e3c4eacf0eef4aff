"""Reads of the serving read models for the API: a tenant's deployments, its replicas' jobs,
a deployment's figures (exact, over the tasks and batches kept; re-derivable with SQL)."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

import asyncpg

from controlplane.queries import Q


async def list_deployments(pool: asyncpg.Pool, tenant: str) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await pool.fetch(Q["list_deployments"], tenant)
    return rows


async def replica_states(pool: asyncpg.Pool, job_ids: Sequence[UUID]) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await pool.fetch(Q["replica_states"], list(job_ids))
    return rows


async def figures(pool: asyncpg.Pool, tenant: str, name: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await pool.fetchrow(Q["deployment_figures"], tenant, name)
    return row
