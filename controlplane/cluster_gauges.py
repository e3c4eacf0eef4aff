"""The cluster's gauges as the database has them (queue depth, GPUs offered and allocated):
sampled by each control plane replica, on each `/metrics` scrape and every few seconds for
OTLP export (collection runs observable callbacks on other threads, which cannot query)."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from controlplane.database import DATABASE_ERRORS
from controlplane.instruments import (
    GPUS,
    GPUS_ALLOCATED,
    QUEUE_DEPTH,
    SERVING_BATCH_SIZE,
    SERVING_QUEUE_DEPTH,
    Reading,
)
from controlplane.queries import Q
from controlplane.workers import pause

log = logging.getLogger(__name__)

SAMPLE_S = 5.0


class ClusterGauges:
    def __init__(self, pool: asyncpg.Pool, *, interval_s: float = SAMPLE_S) -> None:
        self._pool = pool
        self._interval_s = interval_s
        self._queued: list[Reading] = []
        self._gpus: list[Reading] = []
        self._allocated: list[Reading] = []
        self._serving_queued: list[Reading] = []
        self._batch_size: list[Reading] = []
        self._stopping = asyncio.Event()

    async def sample(self) -> None:
        """Read the gauges' values now."""
        queued = await self._pool.fetch(Q["queue_depth"])
        gpus = await self._pool.fetch(Q["gpus_by_node"])
        allocated = await self._pool.fetch(Q["gpus_allocated"])
        serving = await self._pool.fetch(Q["serving_gauges"])
        # Replaced whole, never mutated: a collection on another thread sees one sample.
        self._queued = [(r["jobs"], {"tenant": r["tenant"]}) for r in queued]
        self._gpus = [(r["gpus"], {"node": r["node"]}) for r in gpus]
        self._allocated = [
            (r["gpus"], {"tenant": r["tenant"], "node": r["node"]}) for r in allocated
        ]
        deployment = [{"tenant": r["tenant"], "deployment": r["deployment"]} for r in serving]
        self._serving_queued = [(r["queued"], d) for r, d in zip(serving, deployment, strict=True)]
        self._batch_size = [
            (float(r["batch_size"]), d)
            for r, d in zip(serving, deployment, strict=True)
            if r["batch_size"] is not None
        ]

    async def run(self) -> None:
        """Report the gauges, sampled every interval, until `stop()`."""
        with (
            QUEUE_DEPTH.source(lambda: self._queued),
            GPUS.source(lambda: self._gpus),
            GPUS_ALLOCATED.source(lambda: self._allocated),
            SERVING_QUEUE_DEPTH.source(lambda: self._serving_queued),
            SERVING_BATCH_SIZE.source(lambda: self._batch_size),
        ):
            while not self._stopping.is_set():
                try:
                    await self.sample()
                except DATABASE_ERRORS as exc:
                    # The last sample stays; metrics are no reason to stop the control plane.
                    log.warning("sampling the cluster's gauges failed: %s", exc)
                await pause(self._stopping, self._interval_s)

    def stop(self) -> None:
        self._stopping.set()
