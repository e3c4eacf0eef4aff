"""What a deployment's replicas need now: a pure function of the deployment and its replica
jobs' states, so the rules are tested without a database. The service carries the plan out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from uuid import UUID

from controlplane.deployments.lifecycle import Deployment
from controlplane.jobs.lifecycle import TERMINAL, JobStatus


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

    @property
    def empty(self) -> bool:
        return not (self.retire or self.start or self.submit)


def plan(deployment: Deployment, jobs: Mapping[UUID, JobStatus | None]) -> Plan:
    """`jobs`: the state of each active replica's job (None: not submitted yet)."""
    retire: list[tuple[UUID, str]] = []
    for job_id in deployment.active:
        status = jobs.get(job_id)
        if status is not None and status in TERMINAL:
            retire.append((job_id, f"its job ended {status.value}"))
    ended = {job_id for job_id, _ in retire}
    live = [job_id for job_id in deployment.active if job_id not in ended]
    wanted = 0 if deployment.deleted else deployment.replicas
    cancel: list[UUID] = []
    if len(live) > wanted:
        # The newest go first: the oldest have warmed up (loaded, memo-filled, batching).
        why = "deployment deleted" if deployment.deleted else "scaled down"
        cancel = live[wanted:]
        retire.extend((job_id, why) for job_id in cancel)
        live = live[:wanted]
    return Plan(
        retire=tuple(retire),
        cancel=tuple(cancel),
        start=max(0, wanted - len(live)),
        submit=tuple(job_id for job_id in live if jobs.get(job_id) is None),
    )
