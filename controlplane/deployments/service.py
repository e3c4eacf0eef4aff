"""Carrying out deployment and pipeline commands against the event store, and keeping each
deployment's replicas what it asks for: replica jobs submitted and cancelled through the job
service, so they are placed, isolated, restarted and accounted for like every job."""

from __future__ import annotations

import contextlib
import logging
from uuid import UUID

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.deployments.autoscaler import Load, Policy, desired_replicas
from controlplane.deployments.canary import Errors, Rollback, rollback_reason
from controlplane.deployments.errors import Conflict, InvalidRequest, NotFound
from controlplane.deployments.events import (
    CanaryStarted,
    DeploymentCreated,
    PipelineDefined,
    ReplicaRetired,
)
from controlplane.deployments.lifecycle import (
    DEPLOYMENT,
    PIPELINE,
    Autoscale,
    ChangeReplicas,
    Create,
    Define,
    Delete,
    Deployment,
    DeploymentCommand,
    Pipeline,
    PromoteCanary,
    Remove,
    RollBackCanary,
    Scale,
    SetAutoscaling,
    StartCanary,
)
from controlplane.deployments.names import check_name
from controlplane.deployments.reconcile import plan
from controlplane.deployments.spec import (
    Autoscaling,
    CanaryRequest,
    DeploymentRequest,
    PipelineRequest,
)
from controlplane.deployments.streams import deployment_stream, pipeline_stream
from controlplane.deployments.views import replica_states
from controlplane.events.errors import ConcurrencyError
from controlplane.events.metadata import Metadata
from controlplane.events.records import RecordedEvent
from controlplane.events.store import EventStore
from controlplane.invariants import InvariantBroken
from controlplane.jobs.lifecycle import Cancel, JobStatus, Refused
from controlplane.jobs.manifest import JobManifest, ServableSpec
from controlplane.jobs.service import Jobs, idempotent_id
from controlplane.models.errors import MISSING, ModelError
from controlplane.models.metadata import DataType, ModelMetadata
from controlplane.models.references import parse_reference
from controlplane.models.service import Models

log = logging.getLogger(__name__)

INFERENCE_PREFIX = "inference-"
"""The names of inference jobs' deployments (controlplane/inference)."""
REPLICA_COMMAND = ["python", "-m", "runners.serve"]
"""What a replica runs (the agent runs it with the launcher's own interpreter)."""
REPLICA_RESTARTS = 3
"""Restarts of one replica job (in place, from the agent's side) before the deployment
replaces it with a new one."""
DEPLOYMENT_LABEL = "trainyard.deployment"


def replica_key(name: str, number: int) -> str:
    """The idempotency key a deployment's `number`th replica job is submitted with: the same
    on every try, so that submitting it again after a crash finds the job, never a second."""
    return f"replica\n{name}\n{number}"


def replica_job_id(tenant: str, name: str, number: int) -> UUID:
    return idempotent_id(tenant, replica_key(name, number))


def replica_manifest(deployment: Deployment, *, canary: bool = False) -> JobManifest:
    """A replica's job: of the deployment's version, or (`canary`) of its canary's."""
    resources, serving = deployment.resources, deployment.serving
    model = deployment.canary if canary else deployment
    if model is None:
        raise InvariantBroken(f"deployment {deployment.name}: a canary replica and no canary")
    return JobManifest(
        name=f"{deployment.name}-replica",
        image=resources["image"],
        command=REPLICA_COMMAND,
        gpus_per_learner=resources["gpus"],
        cpus=resources["cpus"],
        memory_mb=resources["memory_mb"],
        max_restarts=REPLICA_RESTARTS,
        restart_on="any_failure",
        labels={DEPLOYMENT_LABEL: deployment.name},
        servable=ServableSpec(
            deployment=deployment.name,
            artifact_sha256=model.artifact_sha256,
            entry_point=model.entry_point,
            requirements=list(model.requirements),
            max_batch_size=serving["max_batch_size"],
            max_wait_ms=serving["max_wait_ms"],
            task_timeout_s=serving["task_timeout_s"],
            inference_job=deployment.inference_job,
        ),
    )


def _replicas_of(deployment: Deployment) -> tuple[UUID, ...]:
    canary = deployment.canary
    return deployment.active if canary is None else (*deployment.active, *canary.active)


def initial_replicas(request: DeploymentRequest) -> int:
    """The replicas a new deployment starts with: its fixed number, or its autoscaling's
    fewest (the load raises them from there)."""
    if request.autoscaling is None:
        return request.replicas
    return request.autoscaling.min_replicas


class Deployments:
    """Deployment and pipeline commands, with their streams as the only truth."""

    def __init__(
        self, store: EventStore, jobs: Jobs, models: Models, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._store = store
        self._jobs = jobs
        self._models = models
        self.clock = clock

    async def load(self, tenant: str, name: str) -> Deployment | None:
        """The deployment now (None: never created, or deleted with its replicas stopped)."""
        state = (await DEPLOYMENT.load(self._store, deployment_stream(tenant, name))).state
        return None if state is None or (state.deleted and not state.active) else state

    async def history(
        self, tenant: str, name: str, *, after: int = 0, limit: int | None = None
    ) -> list[RecordedEvent]:
        """The deployment's recorded events after its version `after`, oldest first, at most
        `limit` of them (across re-creations: one stream)."""
        stream = deployment_stream(tenant, name)
        return await self._store.read_stream(stream, from_version=after + 1, limit=limit)

    async def exists(self, tenant: str, name: str) -> bool:
        """Whether the deployment was ever created (deleted or not: its history stays)."""
        return await self._store.version(deployment_stream(tenant, name)) > 0

    async def version_input(self, tenant: str, name: str, number: int) -> DataType | None:
        """The input a model version's metadata declares (None: no such version)."""
        model = await self._models.load(tenant, name)
        version = None if model is None else model.version(number)
        if version is None:
            return None
        return ModelMetadata.model_validate(version.metadata).servable.input

    async def deploy(
        self,
        tenant: str,
        request: DeploymentRequest,
        actor: str,
        *,
        inference_job: UUID | None = None,
    ) -> Deployment:
        """Deploy the model version; `inference_job`: for that job's queries (the inference
        service's own deployments, whose names users cannot take)."""
        name = check_name(request.name)
        if request.autoscaling is not None and "replicas" in request.model_fields_set:
            raise InvalidRequest(
                "give either a fixed number of replicas or autoscaling, not both",
                field="replicas",
            )
        if inference_job is None and name.startswith(INFERENCE_PREFIX):
            raise InvalidRequest(
                f"names starting with {INFERENCE_PREFIX!r} are those of inference jobs' "
                "deployments; choose another",
                field="name",
            )
        try:
            reference = parse_reference(request.model)
            model, version = await self._models.resolve(tenant, reference)
        except MISSING as exc:
            # The body names a version that does not exist: as a path naming one, a 404.
            raise NotFound(str(exc), field="model") from None
        except ModelError as exc:
            raise InvalidRequest(str(exc), field="model") from None
        metadata = ModelMetadata.model_validate(version.metadata)
        event = DeploymentCreated(
            tenant=tenant,
            name=name,
            model_tenant=model.tenant,
            model_name=model.name,
            reference=request.model,
            version=version.number,
            artifact_sha256=version.artifact_sha256,
            entry_point=metadata.servable.entry_point,
            requirements=list(metadata.servable.requirements),
            resources=request.resources.model_dump(),
            serving=request.serving.model_dump(),
            replicas=initial_replicas(request),
            actor=actor,
            at=self.clock.now(),
            inference_job=inference_job,
            autoscaling=None if request.autoscaling is None else request.autoscaling.model_dump(),
        )
        await self._execute(tenant, name, Create(event), actor)
        return await self.reconcile(tenant, name)

    async def scale(self, tenant: str, name: str, replicas: int, actor: str) -> Deployment:
        await self._owned_by(tenant, name, None)
        await self._execute(tenant, name, Scale(replicas, self.clock.now()), actor)
        return await self.reconcile(tenant, name)

    async def autoscale(self, tenant: str, name: str, load: Load) -> None:
        """Its replicas made what its load needs now (autoscaler.py), the change recorded with
        the load that drove it (the controller's reconcile, next in its sweep, carries it
        out)."""
        state = await self.load(tenant, name)
        if state is None or state.deleted or state.autoscaling is None:
            return  # deleted or turned off a moment ago (the read model that named it lags)
        now = self.clock.now()
        since_change_s = (now - state.updated_at).total_seconds()
        replicas = desired_replicas(
            Policy.of(state.autoscaling), load, state.replicas, since_change_s
        )
        if replicas != state.replicas:
            log.info(
                "deployment %s/%s: autoscaled from %d to %d replicas (%.2f in flight, %d waiting)",
                tenant,
                name,
                state.replicas,
                replicas,
                load.in_flight,
                load.waiting,
            )
            command = Autoscale(replicas, load.in_flight, load.waiting, load.idle_s, now)
            await self._execute(tenant, name, command, "system:autoscaler")

    async def set_autoscaling(
        self, tenant: str, name: str, autoscaling: Autoscaling | None, actor: str
    ) -> Deployment:
        """Its replicas made to follow its load within `autoscaling`'s bounds (from the next
        sweep), or, None, fixed at what they are now."""
        await self._owned_by(tenant, name, None)
        spec = None if autoscaling is None else autoscaling.model_dump()
        command = SetAutoscaling(spec, actor, self.clock.now())
        await self._execute(tenant, name, command, actor)
        return await self.reconcile(tenant, name)

    async def start_canary(
        self, tenant: str, name: str, request: CanaryRequest, actor: str
    ) -> Deployment:
        """A canary of another version of its model beside it (its replicas asked for), or the
        one it has moved to `request.weight`."""
        deployment = await self._owned_by(tenant, name, None)
        if deployment is None or deployment.deleted:
            raise NotFound(f"no deployment {name}")
        try:
            reference = parse_reference(request.model)
            model, version = await self._models.resolve(tenant, reference)
        except MISSING as exc:
            raise NotFound(str(exc), field="model") from None
        except ModelError as exc:
            raise InvalidRequest(str(exc), field="model") from None
        if (model.tenant, model.name) != (deployment.model_tenant, deployment.model_name):
            raise InvalidRequest(
                f"a canary is another version of the deployment's model "
                f"{deployment.model_tenant}/{deployment.model_name}, not of "
                f"{model.tenant}/{model.name}",
                field="model",
            )
        metadata = ModelMetadata.model_validate(version.metadata)
        event = CanaryStarted(
            reference=request.model,
            version=version.number,
            artifact_sha256=version.artifact_sha256,
            entry_point=metadata.servable.entry_point,
            requirements=list(metadata.servable.requirements),
            weight=request.weight,
            replicas=request.replicas,
            rollback=None if request.rollback is None else request.rollback.model_dump(),
            actor=actor,
            at=self.clock.now(),
        )
        await self._execute(tenant, name, StartCanary(event), actor)
        return await self.reconcile(tenant, name)

    async def promote_canary(self, tenant: str, name: str, actor: str) -> Deployment:
        """Its canary's version made its own: the canary's replicas its, the old ones stopped."""
        await self._owned_by(tenant, name, None)
        return await self._move(tenant, name, PromoteCanary(actor, self.clock.now()), actor)

    async def roll_back_canary(self, tenant: str, name: str, actor: str) -> Deployment:
        """Its canary stopped by its owner's command: every request to its own version."""
        deployment = await self._owned_by(tenant, name, None)
        if deployment is None or deployment.canary is None:
            raise Conflict(f"deployment {name} has no canary")
        command = RollBackCanary(
            deployment.canary.version, f"rolled back by {actor}", actor, self.clock.now()
        )
        return await self._move(tenant, name, command, actor)

    async def check_canary(self, tenant: str, name: str, version: int, errors: Errors) -> None:
        """The controller's rule: the canary of `version` rolled back when its errors (read by
        the sweep) passed its rule, the figures recorded with it. Several control planes may
        decide it at once: the first append wins, the others are refused (no canary, or
        another one) and logged."""
        state = await self.load(tenant, name)
        canary = None if state is None else state.canary
        if canary is None or canary.version != version or canary.rollback is None:
            return  # gone, replaced or changed since the sweep read it
        rule = Rollback.of(canary.rollback)
        reason = rollback_reason(rule, errors)
        if reason is None:
            return
        log.warning("deployment %s/%s: canary version %d %s", tenant, name, version, reason)
        actor = "system:canary"
        command = RollBackCanary(
            version,
            reason,
            actor,
            self.clock.now(),
            failed=errors.failed,
            finished=errors.finished,
            window_s=rule.window_s,
        )
        await self._move(tenant, name, command, actor)

    async def _move(
        self, tenant: str, name: str, command: PromoteCanary | RollBackCanary, actor: str
    ) -> Deployment:
        """A promotion or a rollback carried out: the replicas its events retired stopped (as
        `retire` does: the event first, the job's cancel after), then the rest made what the
        deployment asks for."""
        metadata = Metadata.capture(actor, tenant=tenant)
        executed = await DEPLOYMENT.execute(
            self._store, deployment_stream(tenant, name), command, metadata
        )
        for event in executed.events:
            if isinstance(event, ReplicaRetired):
                await self._cancel(event.job_id, event.reason, actor)
        return await self.reconcile(tenant, name)

    async def delete(
        self, tenant: str, name: str, actor: str, *, owner: UUID | None = None
    ) -> Deployment:
        """Delete it; one an inference job owns only for that job (`owner`)."""
        await self._owned_by(tenant, name, owner)
        await self._execute(tenant, name, Delete(actor, self.clock.now()), actor)
        return await self.reconcile(tenant, name)

    async def _owned_by(self, tenant: str, name: str, owner: UUID | None) -> Deployment | None:
        deployment = await self.load(tenant, name)
        if deployment is not None and deployment.inference_job != owner:
            raise Conflict(
                f"deployment {name} runs the queries of inference job "
                f"{deployment.inference_job}: cancel that job instead"
            )
        return deployment

    async def retire(self, tenant: str, name: str, job_id: UUID, reason: str) -> None:
        """Stop one replica that no longer serves (it stopped answering), and start another."""
        actor = "system:deployments"
        command = ChangeReplicas(self.clock.now(), retire=((job_id, reason),))
        await self._execute(tenant, name, command, actor)
        await self._cancel(job_id, reason, actor)
        await self.reconcile(tenant, name)

    async def reconcile(self, tenant: str, name: str) -> Deployment:
        """Bring the deployment's replicas to what it asks for: retire those whose job ended,
        stop extra ones, ask for missing ones. The events go first, the jobs' commands after
        (each idempotent): a crash between them is repaired by the next reconcile."""
        stream = deployment_stream(tenant, name)
        loaded = await DEPLOYMENT.load(self._store, stream)
        state = loaded.state
        if state is None:
            raise NotFound(f"no deployment {name}")
        # The jobs' read model, one query for them all (the manager reconciles every deployment
        # each second): a job it does not show yet counts as never submitted, and submitting
        # it again finds it (idempotent); an end it shows a moment late is retired a moment late.
        replicas = _replicas_of(state)
        rows = await replica_states(self._store.pool, replicas)
        states = {row["job_id"]: JobStatus(row["state"]) for row in rows}
        jobs = {job_id: states.get(job_id) for job_id in replicas}
        todo = plan(state, jobs, self.clock.now())
        if todo.empty:
            return state
        actor = "system:deployments"
        metadata = Metadata.capture(actor, tenant=tenant)
        now = self.clock.now()
        numbers = iter(range(state.started + 1, state.started + todo.start + todo.start_canary + 1))
        new = tuple(replica_job_id(tenant, name, next(numbers)) for _ in range(todo.start))
        new_canary = tuple(replica_job_id(tenant, name, n) for n in numbers)
        if todo.retire or new or new_canary:
            command = ChangeReplicas(now, retire=todo.retire, start=new, start_canary=new_canary)
            try:
                # At the version read: of two concurrent reconciles one conflicts and stops,
                # so they never both ask for the same missing replica.
                executed = await DEPLOYMENT.try_once(
                    self._store, stream, command, metadata, loaded=loaded
                )
            except ConcurrencyError:
                return await self.reconcile(tenant, name)
            if executed.state is None:
                raise InvariantBroken(f"{stream}: a change of replicas left no deployment")
            state = executed.state
            # A canary rolled back in the same append (its replicas failed) has its other
            # replicas retired there too: their jobs are stopped as the extra ones are.
            ended = {job_id for job_id, _ in todo.retire if job_id not in todo.cancel}
            for event in executed.events:
                if isinstance(event, ReplicaRetired) and event.job_id not in ended:
                    await self._cancel(event.job_id, event.reason, actor)
        serving = _replicas_of(state)
        for job_id in (*todo.submit, *new, *new_canary):
            if job_id in serving:  # not a canary's replica when the canary was just rolled back
                await self._submit(state, job_id, metadata)
        return state

    async def _submit(self, deployment: Deployment, job_id: UUID, metadata: Metadata) -> None:
        number = next(
            n
            for n in range(deployment.started, 0, -1)
            if replica_job_id(deployment.tenant, deployment.name, n) == job_id
        )
        canary = deployment.canary is not None and job_id in deployment.canary.active
        await self._jobs.submit(
            deployment.tenant,
            replica_manifest(deployment, canary=canary),
            metadata,
            idempotency_key=replica_key(deployment.name, number),
        )

    async def _cancel(self, job_id: UUID, reason: str, actor: str) -> None:
        metadata = Metadata.capture(actor)
        with contextlib.suppress(Refused):  # it ended meanwhile
            await self._jobs.execute(job_id, Cancel(reason, self.clock.now()), metadata)

    async def _execute(
        self, tenant: str, name: str, command: DeploymentCommand, actor: str
    ) -> Deployment:
        metadata = Metadata.capture(actor, tenant=tenant)
        executed = await DEPLOYMENT.execute(
            self._store, deployment_stream(tenant, name), command, metadata
        )
        if executed.state is None:
            raise NotFound(f"no deployment {name}")
        return executed.state

    async def define_pipeline(self, tenant: str, request: PipelineRequest, actor: str) -> Pipeline:
        name = check_name(request.name)
        for index, step in enumerate(request.steps):
            check_name(step, field=f"steps.{index}")
            deployment = await self.load(tenant, step)
            if deployment is None or deployment.deleted:
                raise NotFound(f"no deployment {step}", field=f"steps.{index}")
        event = PipelineDefined(
            tenant=tenant, name=name, steps=request.steps, actor=actor, at=self.clock.now()
        )
        metadata = Metadata.capture(actor, tenant=tenant)
        executed = await PIPELINE.execute(
            self._store, pipeline_stream(tenant, name), Define(event), metadata
        )
        if executed.state is None:
            raise InvariantBroken(f"pipeline {name}: its definition left no pipeline")
        return executed.state

    async def pipeline(self, tenant: str, name: str) -> Pipeline | None:
        return (await PIPELINE.load(self._store, pipeline_stream(tenant, name))).state

    async def remove_pipeline(self, tenant: str, name: str, actor: str) -> None:
        metadata = Metadata.capture(actor, tenant=tenant)
        command = Remove(actor, self.clock.now())
        await PIPELINE.execute(self._store, pipeline_stream(tenant, name), command, metadata)
