"""The lifecycle manager: exactly one control plane replica at a time runs the sweeps the
features contribute (controlplane.sweeps; the composition root lists them): lost nodes, deploy
timeouts, the deployment controller, inference jobs, and what retention lets go. It holds the
lock that makes it the one, runs every step in order once a sweep, and keeps one step's failure
from stopping the others; what each step does is its feature's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime

from controlplane.database import CONNECTION_ERRORS, DATABASE_ERRORS, DatabaseUnavailable, connect
from controlplane.queries import Q
from controlplane.sweeps import WORKER, Sweep, Tenure
from controlplane.workers import item_failed, pause

log = logging.getLogger(__name__)


class LifecycleManager:
    """Every replica runs one; the one holding the manager lock is active, the others stand by
    and take over within one interval of its death (its lock ends with its session)."""

    def __init__(self, url: str, sweeps: Sequence[Sweep], *, interval_s: float = 1.0) -> None:
        """`sweeps`: the steps of a sweep, in the order they run."""
        self._url = url
        self._sweeps = tuple(sweeps)
        self.interval_s = interval_s
        self.active = False
        self._stopping = asyncio.Event()
        self._session_lost = False
        self._resumed_at: datetime | None = None
        """When this manager last took the lock after losing its session to the database (see
        `Tenure.resumed_at`)."""

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._hold_lock_and_sweep()
            except (DatabaseUnavailable, *DATABASE_ERRORS) as exc:
                # DatabaseUnavailable: no server took the connection (the primary is down, or
                # a failover is under way); raised, it would end every background task.
                log.warning("lifecycle manager: %s; retrying", exc)
                self._session_lost = True
            self.active = False
            await pause(self._stopping, self.interval_s)

    async def _hold_lock_and_sweep(self) -> None:
        conn = await connect(self._url)
        try:
            while not self._stopping.is_set():
                if not self.active:
                    self.active = bool(await conn.fetchval(Q["manager_lock"]))
                    if self.active:
                        log.info("lifecycle manager: active")
                        if self._session_lost:
                            self._resumed_at = await conn.fetchval(Q["database_now"])
                            self._session_lost = False
                # Sweep at once on taking over: a node may have expired while nobody swept.
                if self.active:
                    # Still holding the lock only while this session lives: check it first.
                    # (Should it die just after, two replicas may sweep at once for a moment;
                    # a sweep is transactional and conditional, so neither repeats the other.)
                    await conn.fetchval(Q["ping"])
                    await self.sweep()
                await pause(self._stopping, self.interval_s)
        finally:
            await asyncio.shield(conn.close(timeout=5))

    async def sweep(self) -> None:
        """Run every step once, in order."""
        tenure = Tenure(resumed_at=self._resumed_at)
        for sweep in self._sweeps:
            try:
                await sweep.step(tenure)
            except (DatabaseUnavailable, *CONNECTION_ERRORS):
                # The database went away: every later step would fail alike, and `run` takes
                # a new session (and the lock again) once it is back.
                raise
            except Exception:
                # A step's own bug, or a statement the database refused for its data: that
                # step tries again next sweep, and the others still run.
                item_failed(WORKER, f"the {sweep.name} step")
