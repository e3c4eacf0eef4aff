"""The contract between the lifecycle manager and the features it sweeps for: each feature
contributes its periodic steps (a `Sweep`) from its own package, the composition root lists them
in the order of a sweep, and the manager (controlplane.agents.manager) runs them, one replica at
a time, under its lock. This module imports no feature, so that any feature may implement it and
the manager needs none of them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

ACTOR = "system:lifecycle-manager"
"""The actor of the events a sweep appends (restarts, rollbacks): audits name it."""
WORKER = "lifecycle-manager"
"""The worker a sweep's failures are logged and counted under (`workers.isolated`)."""


@dataclass(frozen=True, slots=True)
class Tenure:
    """What a step may need to know of the active manager's hold on its lock."""

    resumed_at: datetime | None
    """The database's time at which this manager took the lock back after losing its session
    to the database (a failover), else None: nobody could renew anything while the database
    moved, so what counts time since the last renewal (leases) counts from here too."""


class Sweep(Protocol):
    """One feature's periodic step, run once a sweep by the active manager only. A step keeps
    itself short (the manager's next sweep waits for it), transactional and conditional: should
    two replicas sweep at once for a moment, neither repeats the other's work. A failure on one
    item's data is the step's to isolate; one that escapes the step is logged and counted, and
    the sweep goes on with the next step."""

    @property
    def name(self) -> str:
        """How logs and metrics name the step."""
        ...

    async def step(self, tenure: Tenure) -> None: ...
