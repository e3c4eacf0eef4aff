"""Lifecycle managers for tests that run no serving: the sweeps of a control plane without
deployments or inference jobs (controlplane.composition.sweeps lists those of a whole one)."""

from __future__ import annotations

import asyncpg

from controlplane.agents.lost_nodes import LostNodes
from controlplane.agents.manager import LifecycleManager
from controlplane.events.store import EventStore
from controlplane.jobs.deploy_timeouts import DeployTimeouts
from controlplane.jobs.retention import JobRetention
from controlplane.settings import LOG_RETENTION_S
from controlplane.sweeps import Sweep


def lifecycle_manager(
    url: str,
    pool: asyncpg.Pool,
    store: EventStore,
    *,
    log_retention_s: float = LOG_RETENTION_S,
    interval_s: float = 1.0,
) -> LifecycleManager:
    """A manager of lost nodes, deploy timeouts and retention (`log_retention_s`, 0: never)."""
    sweeps: list[Sweep] = [
        LostNodes(pool, store),
        DeployTimeouts(pool, store),
        JobRetention(pool, log_retention_s),
    ]
    return LifecycleManager(url, sweeps, interval_s=interval_s)
