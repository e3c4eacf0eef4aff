"""Inference jobs: a job (its states, history, cancel and streams are a job's) that holds no
node itself; its queries run on the replicas of a deployment it owns, which the agents feed
straight from Postgres (node_agent/inference.py). The service submits the job, makes its row
and its deployment, and moves it on as its queries do: PROCESSING at its first query,
COMPLETED when the last has finished, FAILED when its model cannot be loaded; once it has
ended, its deployment goes.

Every step is idempotent and the lifecycle manager repeats them each sweep (`sweep`), so a
control plane killed between two steps leaves nothing half done for long, and the queries
never wait for it: the agents make and run them on their own."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.deployments.errors import Conflict, InvalidRequest, NotFound
from controlplane.deployments.service import INFERENCE_PREFIX, REPLICA_COMMAND, Deployments
from controlplane.deployments.spec import DeploymentRequest, Resources, Serving
from controlplane.events.metadata import Metadata
from controlplane.inference.progress import MAX_TRIES, Progress, Step, steps
from controlplane.inference.spec import InferenceRequest
from controlplane.jobs.lifecycle import Job, JobStatus, Refused
from controlplane.jobs.limits import JobLimits
from controlplane.jobs.manifest import InferenceSpec, JobManifest, stored_manifest
from controlplane.jobs.service import Jobs
from controlplane.models.errors import MISSING, ModelError
from controlplane.models.metadata import DataType, ModelMetadata
from controlplane.models.references import parse_reference
from controlplane.models.service import Models
from controlplane.queries import Q
from controlplane.workers import isolated

log = logging.getLogger(__name__)

ACTOR = "system:inference"
WORKER = "inference-sweep"
INFERENCE_LABEL = "trainyard.inference"


def deployment_name(job_id: UUID) -> str:
    """The deployment an inference job owns; users cannot take such names (deployments refuse
    the prefix to them)."""
    return f"{INFERENCE_PREFIX}{job_id.hex[:16]}"


@dataclass(frozen=True, slots=True)
class Stalled:
    """A replica that held a query past the job's timeout: it is replaced."""

    tenant: str
    deployment: str
    replica: UUID
    timeout_s: float


class Inference:
    def __init__(
        self,
        pool: asyncpg.Pool,
        jobs: Jobs,
        models: Models,
        deployments: Deployments,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._pool = pool
        self._jobs = jobs
        self._models = models
        self._deployments = deployments
        self._clock = clock

    async def manifest(
        self, tenant: str, request: InferenceRequest, job_id: UUID
    ) -> tuple[JobManifest, DataType]:
        """The manifest of the job `job_id` (`new_job_id`'s: its deployment is named after
        it), its model version resolved (InvalidRequest naming `model`); and the input that
        version declares."""
        try:
            model, version = await self._models.resolve(tenant, parse_reference(request.model))
        except MISSING as exc:
            # The body names a version that does not exist: as a path naming one, a 404.
            raise NotFound(str(exc), field="model") from None
        except ModelError as exc:
            raise InvalidRequest(str(exc), field="model") from None
        # A version without a servable entry point is refused here, not by its replicas.
        servable = ModelMetadata.model_validate(version.metadata).servable
        resources = request.resources
        manifest = JobManifest(
            name=request.name,
            image=resources.image,
            command=REPLICA_COMMAND,
            gpus_per_learner=resources.gpus,
            cpus=resources.cpus,
            memory_mb=resources.memory_mb,
            labels={**request.labels, INFERENCE_LABEL: model.name},
            inference=InferenceSpec(
                model=request.model,
                model_tenant=model.tenant,
                model_name=model.name,
                version=version.number,
                deployment=deployment_name(job_id),
                input=request.input.model_dump(exclude_none=True),
                batch_size=request.batch_size,
                queries=request.query_count,
                weight=request.weight,
                replicas=request.replicas,
                query_timeout_s=request.query_timeout_s,
            ),
        )
        return manifest, servable.input

    async def submit(
        self,
        tenant: str,
        job_id: UUID,
        manifest: JobManifest,
        metadata: Metadata,
        idempotency_key: str | None,
        limits: JobLimits | None,
    ) -> tuple[Job, bool]:
        """Submit the job `job_id` (`new_job_id`'s, which its `manifest` was made for), then
        make its row and its deployment (the lifecycle manager does both again should this
        control plane die in between)."""
        job, created = await self._jobs.submit(
            tenant, manifest, metadata, idempotency_key, limits, job_id=job_id
        )
        await self.prepare(job.job_id, tenant, job.manifest)
        return job, created

    async def prepare(self, job_id: UUID, tenant: str, manifest: JobManifest) -> None:
        """The job's row and its deployment, each made once."""
        spec = manifest.inference
        if spec is None:
            raise InvalidRequest("the idempotency key names a job that is not an inference job")
        await self._pool.execute(
            Q["insert_inference_job"],
            job_id,
            tenant,
            spec.deployment,
            spec.weight,
            spec.batch_size,
            spec.queries,
            json.dumps(spec.input),
        )
        if await self._deployments.load(tenant, spec.deployment) is not None:
            return
        request = DeploymentRequest(
            name=spec.deployment,
            model=f"{spec.model_tenant}/{spec.model_name}:{spec.version}",
            replicas=spec.replicas,
            resources=Resources(
                gpus=manifest.gpus_per_learner,
                cpus=manifest.cpus,
                memory_mb=manifest.memory_mb,
                image=manifest.image,
            ),
            serving=Serving(
                max_batch_size=spec.batch_size,
                max_wait_ms=0,
                memo=False,
                task_timeout_s=spec.query_timeout_s,
            ),
        )
        with contextlib.suppress(Conflict):  # made meanwhile by another control plane
            await self._deployments.deploy(tenant, request, ACTOR, inference_job=job_id)

    async def sweep(self) -> None:
        """The lifecycle manager's step for inference jobs: replace replicas hanging on a
        query, move each live job on as its queries have, and take the deployment of each
        ended job away."""
        for stalled in await self.stalled():
            reason = f"unresponsive: held a query past its {stalled.timeout_s:g}s timeout"
            log.warning(
                "inference %s/%s: replica %s %s",
                stalled.tenant,
                stalled.deployment,
                stalled.replica,
                reason,
            )
            await isolated(
                WORKER,
                f"inference {stalled.tenant}/{stalled.deployment}",
                self._retire(stalled, reason),
            )
        # Each job's step on its own: one job's data (or a bug it meets) is logged and counted,
        # and the other jobs still move on.
        for row in await self._pool.fetch(Q["live_inference_jobs"]):
            await isolated(WORKER, f"inference job {row['job_id']}", self._advance(row))
        for row in await self._pool.fetch(Q["ended_inference_jobs"]):
            await isolated(WORKER, f"inference job {row['job_id']}", self._end(row))

    async def _retire(self, stalled: Stalled, reason: str) -> None:
        with contextlib.suppress(NotFound, Conflict):
            await self._deployments.retire(
                stalled.tenant, stalled.deployment, stalled.replica, reason
            )

    async def _end(self, row: asyncpg.Record) -> None:
        await self._pool.execute(Q["end_inference_job"], row["job_id"])
        with contextlib.suppress(NotFound):
            await self._deployments.delete(
                row["tenant"], row["deployment"], ACTOR, owner=row["job_id"]
            )

    async def stalled(self) -> list[Stalled]:
        rows = await self._pool.fetch(Q["stalled_queries"], MAX_TRIES)
        return [
            Stalled(row["tenant"], row["deployment"], row["replica"], row["timeout_s"])
            for row in rows
        ]

    async def _advance(self, row: asyncpg.Record) -> None:
        job_id: UUID = row["job_id"]
        if row["deployment"] is None:
            # As stored: a job submitted before today's rules reads within them.
            manifest = JobManifest.model_validate(stored_manifest(json.loads(row["manifest"])))
            await self.prepare(job_id, row["tenant"], manifest)
            return
        progress = Progress(
            state=JobStatus(row["state"]),
            queries=row["queries"],
            started=row["started"],
            unfinished=row["unfinished"],
            load_error=row["load_error"],
        )
        for step in steps(progress, self._clock.now()):
            await self._execute(job_id, step)

    async def _execute(self, job_id: UUID, command: Step) -> None:
        metadata = Metadata.capture(ACTOR)
        with contextlib.suppress(Refused):  # the job moved on meanwhile (cancelled, say)
            await self._jobs.execute(job_id, command, metadata)
