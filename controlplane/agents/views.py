"""Read-model queries over the nodes: what the API, a dashboard or the CLI shows of them."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from controlplane.database import Executor
from controlplane.queries import Q
from controlplane.scheduling.unschedulable import LiveNodes


async def live_nodes(db: Executor) -> LiveNodes:
    """What the READY nodes offer now: the most of each resource one node has, and their
    healthy GPUs together."""
    row = await db.fetchrow(Q["live_nodes"])
    if row is None:  # an aggregate without GROUP BY always returns its one row
        raise RuntimeError("live_nodes returned no row")
    return LiveNodes(
        nodes=row["nodes"],
        gpus=row["gpus"],
        cpus=row["cpus"],
        memory_mb=row["memory_mb"],
        total_gpus=row["total_gpus"],
    )


async def list_nodes(db: Executor, name: str | None = None) -> list[dict[str, Any]]:
    """Every node by name (or node `name` only), as JSON-ready dicts: its state (UNRESPONSIVE
    once its lease has expired and before the lifecycle manager declares it lost), whether an
    operator drained it, capacity and what is allocated, and its GPUs, each with the job,
    attempt and learner that holds it (None: free)."""
    return [_node(row) for row in await db.fetch(Q["list_nodes"], name)]


def _node(row: asyncpg.Record) -> dict[str, Any]:
    gpus = json.loads(row["gpus"]) if isinstance(row["gpus"], str) else row["gpus"]
    for gpu in gpus:
        gpu["allocated"] = gpu["job_id"] is not None
    state = row["state"]
    if state == "READY" and row["expired"]:
        state = "UNRESPONSIVE"  # lease expired; the lifecycle manager will declare it lost
    return {
        "name": row["name"],
        "state": state,
        "draining": row["draining"],
        "runtime": row["runtime"],
        "lease_until": row["lease_until"].isoformat(),
        "heartbeat_at": row["heartbeat_at"].isoformat(),
        "registered_at": row["registered_at"].isoformat(),
        "cpus": row["cpus"],
        "cpus_allocated": float(row["cpus_allocated"]),
        "memory_mb": row["memory_mb"],
        "memory_mb_allocated": int(row["memory_mb_allocated"]),
        "gpus": gpus,
        "gpus_free": sum(1 for g in gpus if g["healthy"] and not g["allocated"]),
        "gpus_allocated": sum(1 for g in gpus if g["allocated"]),
    }
