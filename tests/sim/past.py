"""A cluster's past written event by event into a store (in memory, or Postgres), with the
product's own event types, at the instants a test names (seconds after T0)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol
from uuid import UUID

from controlplane.agents.events import GpuInfo, NodeGpuUnhealthy, NodeLost, NodeRegistered
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.memory import InMemoryEventStore
from controlplane.events.metadata import Metadata
from controlplane.events.records import Appended
from controlplane.events.types import Event
from controlplane.jobs.events import (
    JobCancelled,
    JobCompleted,
    JobDeploying,
    JobRestarted,
    JobSubmitted,
)
from controlplane.jobs.manifest import JobManifest
from controlplane.tenants.events import TenantCreated, TenantUpdated
from sim.log import recorded_events
from sim.recording import workload_of
from sim.workload import Workload

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
WHO = Metadata(actor="test")
INFERENCE = {
    "model": "m",
    "model_tenant": "a",
    "model_name": "m",
    "version": 1,
    "deployment": "d",
    "input": {},
    "batch_size": 1,
    "queries": 1,
    "weight": 1.0,
    "replicas": 1,
    "query_timeout_s": 10,
}
"""An inference job's spec: such a job holds no node of its own."""


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Appending(Protocol):
    async def append(
        self, stream_id: str, expected_version: int, events: Sequence[Event], metadata: Metadata
    ) -> Appended: ...

    async def version(self, stream_id: str) -> int: ...


class Past:
    def __init__(self, store: Appending | None = None) -> None:
        self.store = store if store is not None else InMemoryEventStore(EVENT_REGISTRY)
        self._jobs = 0
        self._epoch = 0

    async def _append(self, stream: str, event: Event) -> None:
        await self.store.append(stream, await self.store.version(stream), [event], WHO)

    async def tenant(self, name: str, weight: float = 1.0, quota: int | None = None) -> None:
        created = TenantCreated(name=name, weight=weight, gpu_quota=quota, at=T0)
        await self._append(f"tenant-{name}", created)

    async def update_tenant(self, name: str, s: float, weight: float, quota: int | None) -> None:
        updated = TenantUpdated(weight=weight, gpu_quota=quota, at=at(s))
        await self._append(f"tenant-{name}", updated)

    async def node(self, name: str, gpus: int, s: float = 0.0, cpus: float = 64.0) -> None:
        offered = [
            GpuInfo(index=i, uuid=gpu(name, i), model="fake", memory_mb=80_000, healthy=True)
            for i in range(gpus)
        ]
        registered = NodeRegistered(
            agent_id=UUID(int=1), runtime="process", cpus=cpus, memory_mb=1 << 20,
            gpus=offered, at=at(s),
        )  # fmt: skip
        await self._append(f"node-{name}", registered)

    async def gpu_fails(self, node: str, index: int, s: float) -> None:
        failed = NodeGpuUnhealthy(uuid=gpu(node, index), reason="xid", at=at(s))
        await self._append(f"node-{node}", failed)

    async def lose(self, node: str, s: float) -> None:
        await self._append(f"node-{node}", NodeLost(agent_id=UUID(int=1), reason="", at=at(s)))

    async def submit(
        self,
        tenant: str,
        s: float,
        *,
        gpus: int = 1,
        learners: int = 1,
        priority: int = 0,
        cpus: float = 1.0,
        inference: bool = False,
    ) -> UUID:
        self._jobs += 1
        job_id = UUID(int=self._jobs)
        manifest = JobManifest.model_validate(
            {
                "name": "job",
                "image": "img",
                "command": ["train"],
                "gpus_per_learner": gpus,
                "learners": learners,
                "priority": priority,
                "cpus": cpus,
                "inference": INFERENCE if inference else None,
            }
        )
        submitted = JobSubmitted(job_id=job_id, tenant=tenant, manifest=manifest, at=at(s))
        await self._append(f"job-{job_id}", submitted)
        return job_id

    async def claim(
        self,
        job_id: UUID,
        s: float,
        node: str,
        *indexes: int,
        attempt: int = 1,
        also: tuple[str, int] | None = None,
    ) -> None:
        """The job's claim of GPUs `indexes` of `node` (and GPU `also` of another node)."""
        self._epoch += 1
        gpus = [gpu(node, i) for i in indexes]
        nodes = [node]
        if also is not None:
            nodes.append(also[0])
            gpus.append(gpu(*also))
        claimed = JobDeploying(attempt=attempt, nodes=nodes, gpus=gpus, epoch=self._epoch, at=at(s))
        await self._append(f"job-{job_id}", claimed)

    async def complete(self, job_id: UUID, s: float, attempt: int = 1) -> None:
        completed = JobCompleted(attempt=attempt, exit_codes=[0], at=at(s))
        await self._append(f"job-{job_id}", completed)

    async def run(self, job_id: UUID, start: float, end: float, node: str, *indexes: int) -> None:
        await self.claim(job_id, start, node, *indexes)
        await self.complete(job_id, end)

    async def cancel(self, job_id: UUID, s: float) -> None:
        await self._append(f"job-{job_id}", JobCancelled(reason="user", at=at(s)))

    async def restart(
        self, job_id: UUID, s: float, backoff_s: float = 0.0, attempt: int = 2
    ) -> None:
        restarted = JobRestarted(
            reason="learner 0 killed by SIGKILL",
            attempt=attempt,
            resume_from=None,
            not_before=at(s + backoff_s) if backoff_s else None,
            at=at(s),
        )
        await self._append(f"job-{job_id}", restarted)

    async def workload(self, since: float | None = None, until: float | None = None) -> Workload:
        if not isinstance(self.store, InMemoryEventStore):
            raise TypeError("a past in Postgres is read with sim.log.read_workload")
        events = await recorded_events(self.store)
        return workload_of(
            events,
            None if since is None else at(since),
            None if until is None else at(until),
        )


def gpu(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


async def fair_share_past(past: Past) -> list[UUID]:
    """Two GPUs of node n; tenant a queues four jobs (a1..a4, at 0 to 3 s), then b two (b1, b2,
    at 4 and 5 s); each runs 10 s, in the order fair share gave them the GPUs: b takes one as
    soon as a holds one and b none. The jobs, a's and then b's."""
    await past.tenant("a")
    await past.tenant("b")
    await past.node("n", gpus=2)
    a1, a2, a3, a4 = [await past.submit("a", s) for s in (0, 1, 2, 3)]
    b1, b2 = [await past.submit("b", s) for s in (4, 5)]
    for job, start, gpu in ((a1, 0, 0), (a2, 1, 1), (b1, 10, 0), (a3, 11, 1), (b2, 20, 0)):
        await past.run(job, start, start + 10, "n", gpu)
    await past.run(a4, 21, 31, "n", 1)
    return [a1, a2, a3, a4, b1, b2]
