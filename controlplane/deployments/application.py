"""Serving as its front ends use it: deployments (deploy, list, read, scale, delete, figures),
pipelines (define, read, remove), predictions and their tasks.

A facade in the sense of eventsourcing's Application: it takes requests already parsed and the
tenant acted for (the HTTP layer routes and authenticates, nothing more), checks them against
the rules and the tenant's limits before anything is written, runs them through the
`Deployments` service and the `Tasks` queue, and answers with the views of
`controlplane.deployments.views`. What it refuses it raises as a `Refusal`; a deployment that
kept changing under concurrent commands is `Busy` (retry), which no refusal's kind says.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import replace
from uuid import UUID

import asyncpg

from controlplane.admission import gate
from controlplane.admission.policy import replica_room
from controlplane.deployments.errors import InvalidRequest, NotFound, ServingError
from controlplane.deployments.inputs import DeclaredInput, check_items, declared_input
from controlplane.deployments.lifecycle import Busy, Deployment, Pipeline
from controlplane.deployments.names import NAME
from controlplane.deployments.reconcile import next_start
from controlplane.deployments.service import Deployments
from controlplane.deployments.spec import (
    DeploymentRequest,
    PipelineRequest,
    PredictRequest,
    ScaleRequest,
)
from controlplane.deployments.tasks import IdempotencyMismatch, Target, Tasks, new_task_id
from controlplane.deployments.views import (
    BatchFigures,
    DeploymentFigures,
    DeploymentList,
    DeploymentSummary,
    DeploymentView,
    MemoFigures,
    PipelineView,
    Quantiles,
    QueuedTask,
    ReplicaJob,
    TaskView,
    list_deployments,
    replica_states,
    task_view,
)
from controlplane.deployments.views import figures as deployment_figures
from controlplane.instruments import SERVING_LATENCY, SERVING_REQUESTS
from controlplane.jobs.images import ImageAllowlist, ImageRefused
from controlplane.refusals import Refusal, Refused

SYNC_WAIT_S = 20.0
"""How long a synchronous prediction waits for its result before it is answered 202 (the task
goes on; its Location says where to read it): under the SDK's request timeout (30 s), which
then waits for the task."""
MAX_DECLARED_INPUTS = 4096
"""Model versions whose declared input a process keeps at hand (a version's never changes)."""


@contextlib.contextmanager
def refusing() -> Iterator[None]:
    """The serving errors raised in the block as refusals; `Busy` stays itself (retry soon)."""
    try:
        yield
    except Busy:
        raise
    except ServingError as exc:
        raise refusal(exc) from exc


def refusal(exc: ServingError) -> Refusal:
    """A serving error as what the front ends say."""
    if isinstance(exc, InvalidRequest):
        return Refusal(Refused.INVALID, str(exc), field=exc.field)
    if isinstance(exc, NotFound):
        return Refusal(Refused.NOT_FOUND, str(exc), field=exc.field)
    return Refusal(Refused.CONFLICT, str(exc))


class ServingApplication:
    def __init__(
        self, deployments: Deployments, tasks: Tasks, pool: asyncpg.Pool, *, images: ImageAllowlist
    ) -> None:
        self.deployments = deployments
        self._tasks = tasks
        self._pool = pool
        self._images = images
        self._inputs: dict[tuple[str, str, int], DeclaredInput | None] = {}
        """By model version: what its items must be, read once from its metadata."""

    async def deploy(self, tenant: str, request: DeploymentRequest, actor: str) -> DeploymentView:
        """Deploy a model version: the deployment, its replica jobs asked for."""
        try:
            # Refused here, as a job's is: a replica's node would refuse it at every start.
            self._images.admit(request.resources.image)
        except ImageRefused as exc:
            raise Refusal(Refused.INVALID, str(exc), field="resources.image") from exc
        asked = replica_room(request.replicas, request.resources.cpus, request.resources.memory_mb)
        await gate.admit(self._pool, tenant, replace(asked, deployments=1))
        with refusing():
            deployment = await self.deployments.deploy(tenant, request, actor)
        return await self._view(deployment)

    async def listed(self, tenant: str) -> DeploymentList:
        rows = await list_deployments(self._pool, tenant)
        return DeploymentList(
            items=[
                DeploymentSummary(
                    name=r["name"],
                    model=f"{r['model_tenant']}/{r['model_name']}:{r['version']}",
                    replicas=r["replicas"],
                    replica_jobs=len(r["replica_jobs"]),
                    state="deleting" if r["deleted"] else "serving",
                    created_at=r["created_at"],
                )
                for r in rows
            ]
        )

    async def deployment(self, tenant: str, name: str) -> DeploymentView:
        return await self._view(await self._load(tenant, name))

    async def scale(
        self, tenant: str, name: str, request: ScaleRequest, actor: str
    ) -> DeploymentView:
        """Its replicas made `request.replicas`; more are held to the tenant's limits."""
        current = await self._load(tenant, name)
        more = request.replicas - current.replicas
        if more > 0:
            resources = current.resources
            room = replica_room(more, resources["cpus"], resources["memory_mb"])
            await gate.admit(self._pool, tenant, room)
        with refusing():
            deployment = await self.deployments.scale(tenant, name, request.replicas, actor)
        return await self._view(deployment)

    async def undeploy(self, tenant: str, name: str, actor: str) -> DeploymentView:
        with refusing():
            deployment = await self.deployments.delete(tenant, name, actor)
        return await self._view(deployment)

    async def figures(self, tenant: str, name: str) -> DeploymentFigures:
        """The deployment's figures, over the tasks and batches kept: requests, outcomes, queue
        depth, memo hits and misses, batch sizes and why batches left, latencies."""
        await self._load(tenant, name)
        row = await deployment_figures(self._pool, tenant, name)
        if row is None:
            raise Refusal(Refused.NOT_FOUND, f"no deployment {name}")
        batches = row["batches"]
        return DeploymentFigures(
            deployment=name,
            requests=row["requests"],
            succeeded=row["succeeded"],
            failed=row["failed"],
            queue_depth=row["queue_depth"],
            running=row["running"],
            memo=MemoFigures(
                hits=row["memo_hits"], misses=row["memo_misses"], entries=row["memo_entries"]
            ),
            latency_ms=_quantiles(row["latency_ms"]),
            batches=BatchFigures(
                count=batches,
                items=row["items"],
                mean_size=row["items"] / batches if batches else None,
                max_size=row["max_items"],
                full=row["full"],
                timeout=row["timeout"],
                invocation_ms=_quantiles(row["invocation_ms"]),
                inference_ms=_quantiles(row["inference_ms"]),
            ),
        )

    async def define_pipeline(
        self, tenant: str, request: PipelineRequest, actor: str
    ) -> PipelineView:
        with refusing():
            pipeline = await self.deployments.define_pipeline(tenant, request, actor)
        return _pipeline_view(pipeline)

    async def pipeline(self, tenant: str, name: str) -> PipelineView:
        return _pipeline_view(await self._pipeline(tenant, name))

    async def remove_pipeline(self, tenant: str, name: str, actor: str) -> None:
        with refusing():
            await self.deployments.remove_pipeline(tenant, name, actor)

    async def predict(
        self, tenant: str, name: str, request: PredictRequest, key: str | None
    ) -> TaskView | QueuedTask:
        """Run the deployment's model on the request's inputs: the finished task (the memo's
        answer, or a replica's); queued when asked to (`async`) or when the result takes longer
        than the synchronous wait. Inputs its model version's declared input does not take are
        refused first (`inputs.N`, controlplane/deployments/inputs.py)."""
        # From the stream, not the read model: a deployment deleted a moment ago takes no task.
        deployment = await self._load(tenant, name)
        if deployment.deleted:
            raise Refusal(Refused.NOT_FOUND, f"no deployment {name}")
        check_items(await self._declared_input(deployment), request.inputs, "inputs")
        salt = None
        if deployment.serving["memo"]:
            salt = f"{deployment.artifact_sha256}\n{deployment.entry_point}"
        return await self._run(Target(tenant=tenant, steps=(name,), memo_salt=salt), request, key)

    async def predict_pipeline(
        self, tenant: str, name: str, request: PredictRequest, key: str | None
    ) -> TaskView | QueuedTask:
        """Run a pipeline: one task through its deployments in order."""
        pipeline = await self._pipeline(tenant, name)
        # Its first step takes the request's items; each later step, the one before's outputs.
        first = await self.deployments.load(tenant, pipeline.steps[0])
        if first is not None:
            check_items(await self._declared_input(first), request.inputs, "inputs")
        target = Target(tenant=tenant, steps=pipeline.steps, pipeline=name)
        return await self._run(target, request, key)

    async def _run(
        self, target: Target, request: PredictRequest, key: str | None
    ) -> TaskView | QueuedTask:
        arrived = time.perf_counter()
        await gate.admit_predictions(self._pool, target.tenant, len(request.inputs))
        tasks = self._tasks
        labels = {"tenant": target.tenant, "deployment": target.pipeline or target.steps[0]}
        queued = new_task_id(target.tenant, key)
        # Expected before it is queued: its result cannot come before this request listens.
        with tasks.expecting(queued) as finished:
            try:
                answered = await tasks.answer_or_queue(
                    target, queued, request.inputs, no_cache=request.no_cache, idempotency_key=key
                )
            except IdempotencyMismatch as exc:
                raise Refusal(Refused.CONFLICT, str(exc), field="Idempotency-Key") from exc
            except ValueError as exc:  # NaN, infinity, NUL or a lone surrogate: not storable
                raise Refusal(Refused.INVALID, f"inputs: {exc}", field="inputs") from exc
            memo = "off" if target.memo_salt is None or request.no_cache else "miss"
            SERVING_REQUESTS.add(1, {**labels, "memo": "hit" if answered is not None else memo})
            if answered is None and not request.asynchronous:
                answered = await tasks.wait(finished, SYNC_WAIT_S)
        if answered is None:
            return QueuedTask(task_id=queued, items=len(request.inputs))
        SERVING_LATENCY.record(time.perf_counter() - arrived, labels)
        return task_view(answered)

    async def task(self, tenant: str, task_id: str) -> TaskView:
        """A task: its state, its outputs or error, and its times (request, invocation,
        inference, and each step's)."""
        try:
            uuid = UUID(task_id)
        except ValueError:
            raise Refusal(Refused.NOT_FOUND, "task_id must be a UUID", field="task_id") from None
        row = await self._tasks.get(tenant, uuid)
        if row is None:
            raise Refusal(Refused.NOT_FOUND, f"no task {uuid}")
        return task_view(row)

    async def changes(
        self, tenant: str, task: TaskView, heartbeat_s: float
    ) -> AsyncGenerator[TaskView | None]:
        """`task` now and at each change of its status, until it has finished (or this process
        stops); None each `heartbeat_s` while nothing changes."""
        sent = None
        while True:
            if task.status != sent:
                sent = task.status
                yield task
            if task.finished or self._tasks.stopping:
                return
            idle = False
            with self._tasks.expecting(task.task_id) as finished:
                # Read once listening: a change in between is in the row, or delivered after.
                latest = await self._tasks.get(tenant, task.task_id)
                task = task if latest is None else task_view(latest)
                if task.status == sent:
                    done = await self._tasks.wait(finished, heartbeat_s)
                    if done is None:
                        idle = True
                    else:
                        task = task_view(done)
            # Said outside the block: a reader that stops here leaves no waiter behind.
            if idle:
                yield None

    async def _view(self, deployment: Deployment) -> DeploymentView:
        rows = await replica_states(self._pool, deployment.active)
        states = {r["job_id"]: r for r in rows}
        return DeploymentView(
            name=deployment.name,
            tenant=deployment.tenant,
            model=f"{deployment.model_tenant}/{deployment.model_name}:{deployment.version}",
            reference=deployment.reference,
            version=deployment.version,
            artifact_sha256=deployment.artifact_sha256,
            entry_point=deployment.entry_point,
            replicas=deployment.replicas,
            resources=deployment.resources,
            serving=deployment.serving,
            state="deleting" if deployment.deleted else "serving",
            replica_jobs=[
                ReplicaJob(
                    job_id=job_id,
                    state=states[job_id]["state"] if job_id in states else "QUEUED",
                    attempt=states[job_id]["attempt"] if job_id in states else 1,
                )
                for job_id in deployment.active
            ],
            failures=deployment.failures,
            inference_job=deployment.inference_job,
            next_replica_at=next_start(deployment),
            created_at=deployment.created_at,
            updated_at=deployment.updated_at,
        )

    async def _declared_input(self, deployment: Deployment) -> DeclaredInput | None:
        key = (deployment.model_tenant, deployment.model_name, deployment.version)
        if key not in self._inputs:
            servable = await self.deployments.servable_input(deployment)
            if len(self._inputs) >= MAX_DECLARED_INPUTS:
                del self._inputs[next(iter(self._inputs))]  # the oldest read
            self._inputs[key] = None if servable is None else declared_input(servable)
        return self._inputs[key]

    async def _load(self, tenant: str, name: str) -> Deployment:
        deployment = await self.deployments.load(tenant, name)
        if deployment is None:
            raise Refusal(Refused.NOT_FOUND, f"no deployment {name}")
        return deployment

    async def _pipeline(self, tenant: str, name: str) -> Pipeline:
        pipeline = await self.deployments.pipeline(tenant, name)
        if pipeline is None:
            raise Refusal(Refused.NOT_FOUND, f"no pipeline {name}")
        return pipeline


def named(name: str) -> str:
    """A deployment's or pipeline's name as a path gives it: one no deployment could have
    names none (checked first, before the request's body)."""
    if not NAME.fullmatch(name):
        raise Refusal(Refused.NOT_FOUND, f"no such deployment or pipeline {name[:80]!r}")
    return name


def _quantiles(values: list[float] | None) -> Quantiles:
    p50, p99 = values or (None, None)
    return Quantiles(p50=p50, p99=p99)


def _pipeline_view(pipeline: Pipeline) -> PipelineView:
    return PipelineView(
        name=pipeline.name,
        tenant=pipeline.tenant,
        steps=list(pipeline.steps),
        created_at=pipeline.created_at,
    )
