"""Agents on the port's in-memory twin (`MemoryPort`): real agents, real child processes, fake
GPUs, and no database. `Twin` is the control plane's side as tests drive it (as
`tests.cluster.Plane` is on Postgres), `TwinAgent` an agent on it (as `RunningAgent`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from uuid import UUID

from controlplane.agent_port.memory import MemoryPort
from controlplane.agent_port.values import JobNews
from controlplane.agent_port.wakes import polling
from controlplane.events.metadata import Metadata
from controlplane.jobs.lifecycle import Command, Job, JobStatus
from controlplane.jobs.limits import JobLimits
from controlplane.jobs.manifest import JobManifest
from harness.served import until_registered
from node_agent.agent import AgentConfig
from node_agent.service import run_agent_on

TENANT = "acme"


class TwinJobs:
    """The job service's calls the tests make, on the twin."""

    def __init__(self, port: MemoryPort) -> None:
        self._port = port

    async def submit(
        self,
        tenant: str,
        manifest: JobManifest,
        metadata: Metadata,
        idempotency_key: str | None = None,
        limits: JobLimits | None = None,
    ) -> tuple[Job, bool]:
        job_id = self._port.submit(tenant, manifest, limits=limits)
        job = self._port.job(job_id)
        assert job is not None
        return job, True

    async def execute(self, job_id: UUID, command: Command, metadata: Metadata) -> Job:
        return await self._port.execute(job_id, command, metadata.actor)

    async def current(self, job_id: UUID) -> tuple[Job | None, int]:
        return await self._port.current(job_id)

    async def history(self, job_id: UUID) -> list[JobNews]:
        return await self._port.news(job_id, 0)


class Twin:
    def __init__(self) -> None:
        self.port = MemoryPort()
        self.jobs = TwinJobs(self.port)

    async def submit(self, command: list[str], **extra: Any) -> UUID:
        manifest = JobManifest.model_validate(
            {"name": "t", "image": "img", "command": command, "gpus_per_learner": 1, **extra}
        )
        return self.port.submit(TENANT, manifest)

    async def until(self, job_id: UUID, check: Callable[[Job], bool], seconds: float = 30) -> Job:
        async with asyncio.timeout(seconds):
            while True:
                job = self.port.job(job_id)
                if job is not None and check(job):
                    return job
                await asyncio.sleep(0.05)

    async def state(self, job_id: UUID, *states: JobStatus) -> Job:
        return await self.until(job_id, lambda job: job.state in states)

    async def log_text(self, job_id: UUID) -> list[str]:
        return [line.text for line in self.port.lines(job_id)]


class TwinAgent:
    """An agent on the twin, polling (nothing notifies it)."""

    def __init__(self, twin: Twin, config: AgentConfig, fake_gpus: int) -> None:
        self.config = config
        self.stop = asyncio.Event()
        self.registered = asyncio.Event()
        self.task = asyncio.create_task(
            run_agent_on(
                twin.port,
                polling(config.poll_s),
                config,
                fake_gpus=fake_gpus,
                stop=self.stop,
                registered=self.registered,
            )
        )

    async def started(self) -> TwinAgent:
        await until_registered(self.task, self.registered)
        return self

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 30)
