"""The agent port's contract suite runs on both ports: `port` is parametrized over the in-memory
twin and Postgres, and `control` is the rest of the control plane beside it (what the HTTP API
and the lifecycle manager do), so that each test sets the scene the same way on both."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Protocol
from uuid import UUID, uuid4

import asyncpg
import pytest

from controlplane.agent_port.memory import MemoryPort
from controlplane.agent_port.postgres import PostgresPort
from controlplane.agent_port.protocol import AgentPort
from controlplane.agents.drains import Drains
from controlplane.clock import SYSTEM_CLOCK
from controlplane.database import AGENT_ROLE, create_pool
from controlplane.events.metadata import Metadata
from controlplane.jobs.lifecycle import Cancel, Job
from controlplane.jobs.manifest import JobManifest
from controlplane.queries import Q
from controlplane.scheduling.application import Scheduling
from controlplane.scheduling.policy import ClaimPolicy
from controlplane.scheduling.requests import PolicyRequest
from tests.cluster import USER, Plane
from tests.polling import eventually

TENANT = "acme"
"""The tenant the `plane` fixture creates; the twin creates it as its first job is submitted."""


class Control(Protocol):
    async def submit(self, manifest: JobManifest, secret_env: dict[str, str] | None = None) -> UUID:
        """A job of TENANT's, queued (and claimable: in the claim queue)."""
        ...

    async def job(self, job_id: UUID) -> Job | None: ...

    async def cancel(self, job_id: UUID) -> None:
        """Its tenant cancels the job."""
        ...

    async def expire_folders(self, job_id: UUID) -> None:
        """The job's retention ended (as the lifecycle manager marks it)."""
        ...

    async def release_uids(self) -> int:
        """The lifecycle manager's sweep, with no retention: the uids of jobs that ended and
        whose folders no node records go back; how many."""
        ...

    async def queue_task(self, deployment: str, inputs: list[object]) -> UUID: ...

    async def task(self, task_id: UUID) -> tuple[str, str | None, str | None, int]:
        """A task's state, output, error and tries."""
        ...

    async def start_inference(
        self, job_id: UUID, items: list[object], batch_size: int, queries: int
    ) -> None:
        """An inference job's row, as its service writes it."""
        ...

    async def load_error(self, job_id: UUID) -> str | None:
        """Why the inference job's model could not be loaded, as its replicas said."""
        ...

    async def drain(self, node: str, draining: bool = True) -> None:
        """The admin drains the node (or, `draining` false, puts it back in service)."""
        ...

    async def set_policy(self, policy: ClaimPolicy) -> None:
        """The admin switches the claim policy; the next claim follows it."""
        ...


class MemoryControl:
    def __init__(self, port: MemoryPort) -> None:
        self._port = port

    async def submit(self, manifest: JobManifest, secret_env: dict[str, str] | None = None) -> UUID:
        return self._port.submit(TENANT, manifest, secret_env=secret_env)

    async def job(self, job_id: UUID) -> Job | None:
        return self._port.job(job_id)

    async def cancel(self, job_id: UUID) -> None:
        await self._port.execute(job_id, Cancel(reason="enough", at=SYSTEM_CLOCK.now()), "test")

    async def expire_folders(self, job_id: UUID) -> None:
        self._port.expire_folders(job_id)

    async def release_uids(self) -> int:
        return self._port.release_uids()

    async def queue_task(self, deployment: str, inputs: list[object]) -> UUID:
        return self._port.queue_task(TENANT, deployment, inputs)

    async def task(self, task_id: UUID) -> tuple[str, str | None, str | None, int]:
        return self._port.task(task_id)

    async def start_inference(
        self, job_id: UUID, items: list[object], batch_size: int, queries: int
    ) -> None:
        self._port.start_inference(job_id, {"items": items}, batch_size, queries=queries)

    async def load_error(self, job_id: UUID) -> str | None:
        return self._port.load_error(job_id)

    async def drain(self, node: str, draining: bool = True) -> None:
        self._port.drain(node, draining)

    async def set_policy(self, policy: ClaimPolicy) -> None:
        self._port.set_policy(policy)


class PostgresControl:
    def __init__(self, plane: Plane, owner: asyncpg.Connection) -> None:
        self._plane = plane
        self._owner = owner

    async def submit(self, manifest: JobManifest, secret_env: dict[str, str] | None = None) -> UUID:
        job, _ = await self._plane.jobs.submit(
            TENANT, manifest, Metadata(actor="test", tenant=TENANT), secret_env=secret_env
        )

        async def queued() -> bool:
            found = await self._owner.fetchval(
                "SELECT count(*) FROM job_status WHERE job_id = $1", job.job_id
            )
            return bool(found)

        await eventually(queued)
        return job.job_id

    async def job(self, job_id: UUID) -> Job | None:
        job, _ = await self._plane.jobs.current(job_id)
        return job

    async def cancel(self, job_id: UUID) -> None:
        await self._plane.jobs.execute(job_id, Cancel(reason="enough", at=SYSTEM_CLOCK.now()), USER)

    async def expire_folders(self, job_id: UUID) -> None:
        await self._owner.execute("UPDATE job_folders SET expired = true WHERE job_id = $1", job_id)

    async def release_uids(self) -> int:
        released: int = await self._owner.fetchval(Q["release_learner_uids"], 0)
        return released

    async def queue_task(self, deployment: str, inputs: list[object]) -> UUID:
        task_id = uuid4()
        await self._owner.execute(
            Q["insert_task"],
            task_id,
            TENANT,
            None,
            [deployment],
            len(inputs),
            json.dumps(inputs),
            "off",
            None,
            None,  # for the deployment's own version (no canary's)
        )
        return task_id

    async def task(self, task_id: UUID) -> tuple[str, str | None, str | None, int]:
        row = await self._owner.fetchrow(
            "SELECT state, output::text, error, tries FROM serving_tasks WHERE task_id = $1",
            task_id,
        )
        assert row is not None
        return row["state"], row["output"], row["error"], row["tries"]

    async def start_inference(
        self, job_id: UUID, items: list[object], batch_size: int, queries: int
    ) -> None:
        await self._owner.execute(
            Q["insert_inference_job"],
            job_id,
            TENANT,
            "dep",
            1.0,
            batch_size,
            queries,
            json.dumps({"items": items}),
        )

    async def load_error(self, job_id: UUID) -> str | None:
        error: str | None = await self._owner.fetchval(
            "SELECT load_error FROM inference_jobs WHERE job_id = $1", job_id
        )
        return error

    async def drain(self, node: str, draining: bool = True) -> None:
        drains = Drains(self._plane.pool, self._plane.store)
        if draining:
            await drains.drain(node, "admin", "maintenance")
        else:
            await drains.undrain(node, "admin")

    async def set_policy(self, policy: ClaimPolicy) -> None:
        scheduling = Scheduling(self._plane.pool, self._plane.store, self._plane.runner)
        request = PolicyRequest(order=policy.order, quotas=policy.quotas)
        await scheduling.set_policy(request, "admin")


@pytest.fixture
async def agent_port(db_url: str) -> AsyncIterator[PostgresPort]:
    """The Postgres port with the agent role's rights only, as agents have them."""
    pool = await create_pool(db_url, min_size=1, max_size=4, role=AGENT_ROLE)
    yield PostgresPort(pool)
    await pool.close()


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres), "memory"])
def both(request: pytest.FixtureRequest) -> tuple[AgentPort, Control]:
    if request.param == "memory":
        memory = MemoryPort()
        return memory, MemoryControl(memory)
    plane: Plane = request.getfixturevalue("plane")
    owner: asyncpg.Connection = request.getfixturevalue("owner")
    port: PostgresPort = request.getfixturevalue("agent_port")
    return port, PostgresControl(plane, owner)


@pytest.fixture
def port(both: tuple[AgentPort, Control]) -> AgentPort:
    return both[0]


@pytest.fixture
def control(both: tuple[AgentPort, Control]) -> Control:
    return both[1]
