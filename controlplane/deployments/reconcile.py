"""What a deployment's replicas need now: a pure function of the deployment and its replica
jobs' states, so the rules are tested without a database. The service carries the plan out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from controlplane.deployments.lifecycle import Deployment, failed_reason
from controlplane.jobs.lifecycle import TERMINAL, JobStatus

FAILURES_BEFORE_BACKOFF = 3
"""Replicas that may fail in a row (each after its own restarts) before replacements wait."""
BACKOFF_S = 10.0
MAX_BACKOFF_S = 600.0


def next_start(deployment: Deployment) -> datetime | None:
    """When a replica may be started again after failures in a row (None: at once): a model
    that cannot run must not keep the cluster busy starting replicas that fail."""
    over = deployment.failures - FAILURES_BEFORE_BACKOFF
    if over < 0 or deployment.last_failure_at is None:
        return None
    wait = min(MAX_BACKOFF_S, BACKOFF_S * 2**over)
    return deployment.last_failure_at + timedelta(seconds=wait)


@dataclass(frozen=True, slots=True)
class Plan:
    retire: tuple[tuple[UUID, str], ...] = ()
    """Replicas that no longer serve, and why."""
    cancel: tuple[UUID, ...] = ()
    """Of those, the jobs to stop (the others have ended already)."""
    start: int = 0
    """New replicas to ask for."""
    submit: tuple[UUID, ...] = ()
    """Active replicas whose job was never submitted (a crash between the two steps)."""
    start_canary: int = 0
    """New replicas of its canary to ask for."""

    @property
    def empty(self) -> bool:
        return not (self.retire or self.start or self.submit or self.start_canary)


@dataclass(frozen=True, slots=True)
class _Kept:
    retire: list[tuple[UUID, str]]
    cancel: list[UUID]
    live: list[UUID]


def _keep(
    active: tuple[UUID, ...], wanted: int, jobs: Mapping[UUID, JobStatus | None], why: str
) -> _Kept:
    """Of one version's replicas: those whose job ended, the extra ones to stop, those left."""
    retire: list[tuple[UUID, str]] = []
    for job_id in active:
        status = jobs.get(job_id)
        if status is not None and status in TERMINAL:
            retire.append((job_id, failed_reason(status)))
    ended = {job_id for job_id, _ in retire}
    live = [job_id for job_id in active if job_id not in ended]
    cancel: list[UUID] = []
    if len(live) > wanted:
        # The newest go first: the oldest have warmed up (loaded, memo-filled, batching).
        cancel = live[wanted:]
        retire.extend((job_id, why) for job_id in cancel)
        live = live[:wanted]
    return _Kept(retire, cancel, live)


def plan(deployment: Deployment, jobs: Mapping[UUID, JobStatus | None], now: datetime) -> Plan:
    """`jobs`: the state of each active replica's job, its canary's too (None: not submitted
    yet)."""
    why = "deployment deleted" if deployment.deleted else "scaled down"
    wanted = 0 if deployment.deleted else deployment.replicas
    own = _keep(deployment.active, wanted, jobs, why)
    canary = deployment.canary
    # A canary's replicas are its own number, not the deployment's: its owner sized it.
    canary_wanted = 0 if canary is None or deployment.deleted else canary.replicas
    beside = _keep(() if canary is None else canary.active, canary_wanted, jobs, why)
    waiting = (at := next_start(deployment)) is not None and now < at
    return Plan(
        retire=(*own.retire, *beside.retire),
        cancel=(*own.cancel, *beside.cancel),
        start=0 if waiting else max(0, wanted - len(own.live)),
        submit=tuple(j for j in (*own.live, *beside.live) if jobs.get(j) is None),
        start_canary=max(0, canary_wanted - len(beside.live)),
    )
