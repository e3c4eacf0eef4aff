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
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

import asyncpg

from controlplane.admission import gate
from controlplane.admission.policy import replica_room
from controlplane.deployments.canary import to_canary
from controlplane.deployments.counting import CountedBatch, CountedTask, Counting, MemoUse
from controlplane.deployments.direct import ChannelFailed, DirectAnswer, DirectPath, Route
from controlplane.deployments.errors import InvalidRequest, NotFound, ServingError
from controlplane.deployments.inputs import DeclaredInput, check_items, declared_input
from controlplane.deployments.inputs_text import InputsTexts, check_sent_storable
from controlplane.deployments.lifecycle import DEPLOYMENT, Busy, Deployment, Pipeline
from controlplane.deployments.memo_cache import MemoCache
from controlplane.deployments.names import NAME
from controlplane.deployments.reconcile import next_start
from controlplane.deployments.service import Deployments
from controlplane.deployments.spec import (
    Autoscaling,
    CanaryRequest,
    CanaryRollback,
    DeploymentRequest,
    PipelineRequest,
    PredictRequest,
    ScaleRequest,
)
from controlplane.deployments.tasks import (
    IdempotencyMismatch,
    Target,
    Tasks,
    canonical_memo_key,
    new_task_id,
)
from controlplane.deployments.views import (
    BatchFigures,
    CanaryView,
    DeploymentFigures,
    DeploymentHistory,
    DeploymentHistoryEntry,
    DeploymentList,
    DeploymentSummary,
    DeploymentView,
    MemoFigures,
    PipelineView,
    Quantiles,
    QueuedTask,
    ReplicaJob,
    TaskTimes,
    TaskView,
    list_deployments,
    replica_states,
    task_view,
)
from controlplane.deployments.views import figures as deployment_figures
from controlplane.instruments import SERVING_LATENCY, SERVING_REQUESTS
from controlplane.jobs.images import ImageAllowlist, ImageRefused
from controlplane.queries import Q
from controlplane.refusals import Refusal, Refused

log = logging.getLogger(__name__)

SYNC_WAIT_S = 20.0
"""How long a synchronous prediction waits for its result before it is answered 202 (the task
goes on; its Location says where to read it): under the SDK's request timeout (30 s), which
then waits for the task."""
MAX_DECLARED_INPUTS = 4096
"""Model versions whose declared input a process keeps at hand (a version's never changes)."""
HISTORY_PAGE = 500
"""A page of a deployment's history by default."""
MAX_HISTORY_PAGE = 1000


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
        self,
        deployments: Deployments,
        tasks: Tasks,
        pool: asyncpg.Pool,
        *,
        images: ImageAllowlist,
        direct: DirectPath,
        counting: Counting,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.deployments = deployments
        self._tasks = tasks
        self._pool = pool
        self._images = images
        self._direct = direct
        self._counting = counting
        self._draw = draw
        """Uniform in [0, 1): which version a request goes to, by its canary's weight."""
        self._memo = MemoCache()
        """The memo's first tier, this process's (the durable one is `serving_memo`)."""
        self._texts = InputsTexts()
        self._inputs: dict[tuple[str, str, int], DeclaredInput | None] = {}
        """By model version: what its items must be, read once from its metadata."""

    async def deploy(self, tenant: str, request: DeploymentRequest, actor: str) -> DeploymentView:
        """Deploy a model version: the deployment, its replica jobs asked for."""
        try:
            # Refused here, as a job's is: a replica's node would refuse it at every start.
            self._images.admit(request.resources.image)
        except ImageRefused as exc:
            raise Refusal(Refused.INVALID, str(exc), field="resources.image") from exc
        # An autoscaled deployment is admitted for the most replicas its load may ask for.
        most = request.replicas if request.autoscaling is None else request.autoscaling.max_replicas
        asked = replica_room(most, request.resources.cpus, request.resources.memory_mb)
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

    async def history(
        self, tenant: str, name: str, *, after: int = 0, limit: int = HISTORY_PAGE
    ) -> DeploymentHistory:
        """The deployment's events after its version `after`, at most `limit`, with their time
        and actor: each change of its replicas (its owner's, or its autoscaling's with the load
        that drove it) among them. Paged: an autoscaled deployment's history grows for ever."""
        entries = []
        for recorded in await self.deployments.history(tenant, name, after=after, limit=limit):
            event = DEPLOYMENT.event_of(recorded)
            entries.append(
                DeploymentHistoryEntry(
                    version=recorded.stream_version,
                    position=recorded.position,
                    event=event.type_name,
                    at=event.at,
                    actor=recorded.metadata.actor,
                    data=event.model_dump(mode="json", exclude={"at"}),
                )
            )
        if not entries and not await self.deployments.exists(tenant, name):
            raise Refusal(Refused.NOT_FOUND, f"no deployment {name}")
        full = len(entries) == limit
        return DeploymentHistory(
            tenant=tenant,
            name=name,
            history=entries,
            next_after=entries[-1].version if full else None,
        )

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
        self._direct.forget(tenant, name)
        return await self._view(deployment)

    async def set_autoscaling(
        self, tenant: str, name: str, autoscaling: Autoscaling | None, actor: str
    ) -> DeploymentView:
        """Its replicas follow its load within `autoscaling`'s bounds (None: they stay what they
        are now, fixed); a higher `max_replicas` is held to the tenant's limits first."""
        current = await self._load(tenant, name)
        if autoscaling is not None:
            # The tenant's usage counts it at the most it may have now (admission's queries).
            held = max(current.replicas, (current.autoscaling or {}).get("max_replicas", 0))
            more = autoscaling.max_replicas - held
            if more > 0:
                resources = current.resources
                room = replica_room(more, resources["cpus"], resources["memory_mb"])
                await gate.admit(self._pool, tenant, room)
        with refusing():
            deployment = await self.deployments.set_autoscaling(tenant, name, autoscaling, actor)
        return await self._view(deployment)

    async def start_canary(
        self, tenant: str, name: str, request: CanaryRequest, actor: str
    ) -> DeploymentView:
        """A canary beside it (its replicas held to the tenant's limits first), or the one it
        has moved to `request.weight`; routes here change at once, other processes' within
        ROUTE_FRESH_S."""
        current = await self._load(tenant, name)
        if current.canary is None:
            resources = current.resources
            room = replica_room(request.replicas, resources["cpus"], resources["memory_mb"])
            await gate.admit(self._pool, tenant, room)
        with refusing():
            deployment = await self.deployments.start_canary(tenant, name, request, actor)
        self._direct.forget(tenant, name)
        return await self._view(deployment)

    async def promote_canary(self, tenant: str, name: str, actor: str) -> DeploymentView:
        with refusing():
            deployment = await self.deployments.promote_canary(tenant, name, actor)
        self._direct.forget(tenant, name)
        return await self._view(deployment)

    async def roll_back_canary(self, tenant: str, name: str, actor: str) -> DeploymentView:
        with refusing():
            deployment = await self.deployments.roll_back_canary(tenant, name, actor)
        self._direct.forget(tenant, name)
        return await self._view(deployment)

    async def undeploy(self, tenant: str, name: str, actor: str) -> DeploymentView:
        with refusing():
            deployment = await self.deployments.delete(tenant, name, actor)
        # Its synchronous predictions stop here at once (other processes' routes within
        # ROUTE_FRESH_S): the next reads the deployment deleted, and takes the queue's path.
        self._direct.forget(tenant, name)
        return await self._view(deployment)

    async def figures(self, tenant: str, name: str) -> DeploymentFigures:
        """The deployment's figures, over the tasks and batches kept: requests, outcomes, queue
        depth, memo hits and misses, batch sizes and why batches left, latencies."""
        await self._load(tenant, name)
        await self._counting.flush()  # this process's direct predictions counted
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
                idle=row["idle"],
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
        self,
        tenant: str,
        name: str,
        request: PredictRequest,
        key: str | None,
        sent: str | None = None,
    ) -> TaskView | QueuedTask:
        """Run the deployment's model on the request's inputs: the finished task (the memo's
        answer, or a replica's); queued when asked to (`async`) or when the result takes longer
        than the synchronous wait. Inputs its model version's declared input does not take are
        refused first (`inputs.N`, controlplane/deployments/inputs.py). `sent`: the inputs'
        JSON text as the request carried it, if known (`inputs_text.sent_inputs`).

        A synchronous request without an Idempotency-Key takes the direct path (`_directly`);
        one that must be found again by its key, an asynchronous one, and one the direct path
        could not answer are queued as rows."""
        arrived = time.monotonic()
        # One draw for both paths: a request the direct path could not answer is queued for
        # the version the direct path chose (canary.to_canary).
        draw = self._draw()
        if not request.asynchronous and key is None:
            answered = await self._directly(tenant, name, request, draw, sent)
            if answered is not None:
                return answered
        # What the direct path took (a channel that timed out, say) is not waited for again.
        wait_s = max(0.0, SYNC_WAIT_S - (time.monotonic() - arrived))
        # From the stream, not the read model: a deployment deleted a moment ago takes no task.
        deployment = await self._load(tenant, name)
        if deployment.deleted:
            raise Refusal(Refused.NOT_FOUND, f"no deployment {name}")
        canary = deployment.canary
        model = canary if canary is not None and to_canary(canary.weight, draw) else deployment
        version = (deployment.model_tenant, deployment.model_name, model.version)
        check_items(await self.declared_input_of(version), request.inputs, "inputs")
        salt = None
        if deployment.serving["memo"]:
            salt = f"{model.artifact_sha256}\n{model.entry_point}"
        target = Target(
            tenant=tenant,
            steps=(name,),
            memo_salt=salt,
            version=None if model is deployment else model.version,
        )
        return await self._run(target, request, key, wait_s=wait_s)

    async def predict_pipeline(
        self, tenant: str, name: str, request: PredictRequest, key: str | None
    ) -> TaskView | QueuedTask:
        """Run a pipeline: one task through its deployments in order."""
        pipeline = await self._pipeline(tenant, name)
        # Its first step takes the request's items; each later step, the one before's outputs.
        first = await self.deployments.load(tenant, pipeline.steps[0])
        if first is not None:
            check_items(await self.declared_input_of(first), request.inputs, "inputs")
        target = Target(tenant=tenant, steps=pipeline.steps, pipeline=name)
        return await self._run(target, request, key)

    async def _run(
        self, target: Target, request: PredictRequest, key: str | None, wait_s: float = SYNC_WAIT_S
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
                answered = await tasks.wait(finished, wait_s)
        if answered is None:
            return QueuedTask(task_id=queued, items=len(request.inputs))
        SERVING_LATENCY.record(time.perf_counter() - arrived, labels)
        return task_view(answered)

    async def _directly(
        self, tenant: str, name: str, request: PredictRequest, draw: float, sent: str | None
    ) -> TaskView | None:
        """The direct path: the memo (this process's, then the durable one), else a replica
        through its agent's channel; counted after, off the request's path. None: the request
        is for the queue (no such deployment here: the queue's path says so; no replica on a
        channel; the channel failed)."""
        arrived = time.perf_counter()
        submitted = datetime.now(UTC)
        route = await self._direct.route(tenant, name)
        if route is None:
            return None
        if route.canary is not None and to_canary(route.weight, draw):
            route = route.canary
        check_items(await self.declared_input_of(route.model), request.inputs, "inputs")
        salt = None if request.no_cache else route.memo_salt
        try:
            # Made once, from the request's own text where it can be: the memo's key hashes
            # this text, the replica is sent it and the count records it.
            data = self._texts.text(tenant, request.inputs, sent, canonical=salt is not None)
        except ValueError as exc:  # NaN or infinity: as the queue says
            raise Refusal(Refused.INVALID, f"inputs: {exc}", field="inputs") from exc
        labels = {"tenant": tenant, "deployment": name}
        key = None
        if salt is not None:
            key = canonical_memo_key(salt, data)
            # A hit is answered before the storable check: its input was checked and stored
            # when its result was made, and this one's text is that one's.
            output = await self._memoized(tenant, name, route, key)
            if output is not None:
                task = self._count(
                    tenant,
                    name,
                    request.inputs,
                    data,
                    submitted,
                    memo="hit",
                    key=key,
                    output=output,
                )
                SERVING_REQUESTS.add(1, {**labels, "memo": "hit"})
                SERVING_LATENCY.record(time.perf_counter() - arrived, labels)
                return task
        try:
            check_sent_storable(request.inputs, sent)
        except ValueError as exc:  # a NUL or a lone surrogate: as the queue says
            raise Refusal(Refused.INVALID, f"inputs: {exc}", field="inputs") from exc
        try:
            answer = await self._direct.send(tenant, name, route, data)
        except ChannelFailed as exc:
            log.info("direct path of %s.%s: %s; queued instead", tenant, name, exc)
            self._direct.forget(tenant, name)
            return None
        if answer.output is not None and key is not None:
            self._memo.put(tenant, name, key, answer.output, route.memo_max_entries)
        task = self._count(
            tenant,
            name,
            request.inputs,
            data,
            submitted,
            memo="off" if key is None else "miss",
            key=key,
            output=answer.output,
            answer=answer,
        )
        SERVING_REQUESTS.add(1, {**labels, "memo": task.memo})
        SERVING_LATENCY.record(time.perf_counter() - arrived, labels)
        return task

    async def _memoized(self, tenant: str, name: str, route: Route, key: bytes) -> str | None:
        """The memo's output for `key`: this process's first; the durable memo's else (kept
        here too for next time)."""
        output = self._memo.get(tenant, name, key)
        if output is None:
            output = await self._pool.fetchval(Q["memo_output"], tenant, name, key)
            if output is not None:
                self._memo.put(tenant, name, key, output, route.memo_max_entries)
        return output

    def _count(
        self,
        tenant: str,
        name: str,
        inputs: list[Any],
        data: str,
        submitted: datetime,
        *,
        memo: Literal["hit", "miss", "off"],
        key: bytes | None,
        output: str | None,
        answer: DirectAnswer | None = None,
    ) -> TaskView:
        """The answered task, as the API shows it, handed to be counted."""
        finished = datetime.now(UTC)
        steps: list[dict[str, Any]] = []
        batches: tuple[CountedBatch, ...] = ()
        if answer is not None:
            figures = answer.batch
            calls = figures["calls"]
            steps = [
                {
                    "deployment": name,
                    "replica": str(answer.replica),
                    "batch": calls[0]["batch"],
                    "invocation_ms": figures["invocation_ms"],
                    "inference_ms": figures["inference_ms"],
                }
            ]
            batches = tuple(
                CountedBatch(
                    batch_id=UUID(call["batch"]),
                    tenant=tenant,
                    deployment=name,
                    replica=answer.replica,
                    # Its tasks are counted once, by its first call (as the queue's are).
                    tasks=figures["tasks"] if n == 0 else 0,
                    items=call["items"],
                    reason=figures["reason"],
                    outcome=figures["outcome"],
                    invocation_ms=call["invocation_ms"],
                    inference_ms=call["inference_ms"],
                    at=finished,
                )
                for n, call in enumerate(calls)
            )
        error = None if answer is None else answer.error
        state: Literal["succeeded", "failed"] = "failed" if error is not None else "succeeded"
        task = CountedTask(
            task_id=uuid.uuid4(),
            tenant=tenant,
            deployment=name,
            items=len(inputs),
            input=None if memo == "hit" else data,
            state=state,
            output=output if error is None else None,
            error=error,
            memo=memo,
            memo_key=key,
            replica=None if answer is None else answer.replica,
            tries=0 if answer is None else 1,
            submitted_at=submitted,
            finished_at=finished,
            step_times=json.dumps(steps),
        )
        use = None
        if key is not None and task.output is not None:
            use = MemoUse(tenant, name, key, task.output, finished)
        self._counting.record(task, batches, use)
        # Built unvalidated: every value is this code's own or its agent's (the figures), the
        # output parsed just here, and validating them again was a cost on each direct answer.
        return TaskView.model_construct(
            task_id=task.task_id,
            status=state,
            items=task.items,
            memo=memo,
            tries=task.tries,
            submitted_at=submitted,
            finished_at=finished,
            times=TaskTimes.model_construct(
                request_ms=(finished - submitted).total_seconds() * 1000,
                invocation_ms=steps[0]["invocation_ms"] if steps else None,
                inference_ms=(steps[0]["inference_ms"] or 0.0) if steps else None,
                steps=steps,
            ),
            outputs=None if task.output is None else json.loads(task.output),
            error=error,
            deployment=name,
        )

    async def task(self, tenant: str, task_id: str) -> TaskView:
        """A task: its state, its outputs or error, and its times (request, invocation,
        inference, and each step's)."""
        try:
            uuid = UUID(task_id)
        except ValueError:
            raise Refusal(Refused.NOT_FOUND, "task_id must be a UUID", field="task_id") from None
        row = await self._tasks.get(tenant, uuid)
        if row is None:
            await self._counting.flush()  # a direct prediction of this process's, answered
            row = await self._tasks.get(tenant, uuid)
        if row is None:
            raise Refusal(Refused.NOT_FOUND, f"no task {uuid}")
        return task_view(row)

    async def cancel_task(self, tenant: str, task_id: str) -> TaskView:
        """Cancel a task not yet finished: it fails (`cancelled by its owner`). Queued, no
        replica takes it; running, its replica's call finishes and its result is not
        recorded. Conflict once it has finished; not found if it is not the tenant's."""
        try:
            uuid = UUID(task_id)
        except ValueError:
            raise Refusal(Refused.NOT_FOUND, "task_id must be a UUID", field="task_id") from None
        row = await self._tasks.cancel(tenant, uuid)
        if row is not None:
            return task_view(row)
        finished = await self.task(tenant, task_id)  # not found, or finished
        raise Refusal(Refused.CONFLICT, f"task {uuid} has already {finished.status}")

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
        canary = deployment.canary
        beside = () if canary is None else canary.active
        rows = await replica_states(self._pool, (*deployment.active, *beside))
        states = {r["job_id"]: r for r in rows}

        def jobs(active: tuple[UUID, ...]) -> list[ReplicaJob]:
            return [
                ReplicaJob(
                    job_id=job_id,
                    state=states[job_id]["state"] if job_id in states else "QUEUED",
                    attempt=states[job_id]["attempt"] if job_id in states else 1,
                )
                for job_id in active
            ]

        model = f"{deployment.model_tenant}/{deployment.model_name}"
        return DeploymentView(
            name=deployment.name,
            tenant=deployment.tenant,
            model=f"{model}:{deployment.version}",
            reference=deployment.reference,
            version=deployment.version,
            artifact_sha256=deployment.artifact_sha256,
            entry_point=deployment.entry_point,
            replicas=deployment.replicas,
            resources=deployment.resources,
            serving=deployment.serving,
            autoscaling=(
                None
                if deployment.autoscaling is None
                else Autoscaling.model_validate(deployment.autoscaling)
            ),
            state="deleting" if deployment.deleted else "serving",
            replica_jobs=jobs(deployment.active),
            failures=deployment.failures,
            inference_job=deployment.inference_job,
            next_replica_at=next_start(deployment),
            canary=None
            if canary is None
            else CanaryView(
                model=f"{model}:{canary.version}",
                reference=canary.reference,
                version=canary.version,
                artifact_sha256=canary.artifact_sha256,
                weight=canary.weight,
                replicas=canary.replicas,
                rollback=None
                if canary.rollback is None
                else CanaryRollback.model_validate(canary.rollback),
                replica_jobs=jobs(canary.active),
                started_at=canary.started_at,
            ),
            created_at=deployment.created_at,
            updated_at=deployment.updated_at,
        )

    async def declared_input_of(
        self, deployment: Deployment | tuple[str, str, int]
    ) -> DeclaredInput | None:
        """What the items of the deployment's model version must be (`deployment`: it, or
        its model version's tenant, name and number)."""
        key = (
            deployment
            if isinstance(deployment, tuple)
            else (deployment.model_tenant, deployment.model_name, deployment.version)
        )
        if key not in self._inputs:
            servable = await self.deployments.version_input(*key)
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
