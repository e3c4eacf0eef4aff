"""The deployment controller, a step of the lifecycle manager's sweep: replicas that stopped
answering are replaced (their tasks go back to the queue, or fail after MAX_TRIES), every
deployment's replicas are kept what it asks for (an autoscaled one's, what its load asks for:
autoscaler.py), a canary whose errors passed its rule is rolled back (canary.py), tasks queued
for a version no longer served go to the deployment's own, and tasks left to a deleted
deployment fail."""

from __future__ import annotations

import logging
from collections.abc import Awaitable

import asyncpg

from controlplane.deployments.autoscaler import LOOK_BACK_S, Load
from controlplane.deployments.canary import Errors
from controlplane.deployments.errors import ServingError
from controlplane.deployments.service import Deployments
from controlplane.deployments.tasks import MAX_TRIES
from controlplane.queries import Q
from controlplane.sweeps import WORKER, Tenure
from controlplane.workers import isolated

log = logging.getLogger(__name__)


class DeploymentController:
    """The sweep of deployments and their replicas."""

    name = "deployments"

    def __init__(self, pool: asyncpg.Pool, deployments: Deployments) -> None:
        self._pool = pool
        self._deployments = deployments

    async def step(self, tenure: Tenure) -> None:
        stalled = await self._pool.fetch(Q["stalled_tasks"], MAX_TRIES)
        for row in {(r["tenant"], r["deployment"], r["replica"]): r for r in stalled}.values():
            reason = f"unresponsive: held a task past its {row['timeout_s']:g}s timeout"
            log.warning(
                "deployment %s/%s: replica %s %s",
                row["tenant"],
                row["deployment"],
                row["replica"],
                reason,
            )
            retire = self._deployments.retire(
                row["tenant"], row["deployment"], row["replica"], reason
            )
            await _isolated(f"deployment {row['tenant']}/{row['deployment']}", retire)
        # Autoscaled ones first: a deployment whose load asks for another replica gets its job
        # submitted by the reconcile below, in this sweep, not the next.
        for row in await self._pool.fetch(Q["autoscaled_loads"], LOOK_BACK_S):
            load = Load(
                unfinished=row["unfinished"],
                waiting=row["waiting"],
                mean_in_flight=row["mean_in_flight"],
                idle_s=row["idle_s"],
            )
            autoscale = self._deployments.autoscale(row["tenant"], row["name"], load)
            await _isolated(f"deployment {row['tenant']}/{row['name']}", autoscale)
        # Before the reconcile too: a canary rolled back has its replicas stopped in this sweep.
        for row in await self._pool.fetch(Q["canary_errors"]):
            errors = Errors(finished=row["finished"], failed=row["failed"])
            check = self._deployments.check_canary(
                row["tenant"], row["name"], row["version"], errors
            )
            await _isolated(f"deployment {row['tenant']}/{row['name']}", check)
        for row in await self._pool.fetch(Q["live_deployments"]):
            reconcile = self._deployments.reconcile(row["tenant"], row["name"])
            await _isolated(f"deployment {row['tenant']}/{row['name']}", reconcile)
        await self._pool.execute(Q["retarget_tasks"])
        await self._pool.execute(Q["fail_orphaned_tasks"])


async def _isolated(what: str, step: Awaitable[object]) -> None:
    """A deployment's step: its refusal is logged, its failure recorded (see
    `workers.isolated`), and neither stops the sweep for the other deployments."""
    await isolated(WORKER, what, _refusal_logged(what, step))


async def _refusal_logged(what: str, step: Awaitable[object]) -> None:
    # A refusal (the deployment was deleted, scaled meanwhile) is the next sweep's to see
    # again: no failure of the worker.
    try:
        await step
    except ServingError as exc:
        log.warning("%s: %s", what, exc)
