"""The deployment and pipeline lifecycles, and the replicas' reconcile plan: pure functions,
tested without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from controlplane.deployments.errors import Conflict, NotFound
from controlplane.deployments.events import DeploymentCreated, PipelineDefined
from controlplane.deployments.lifecycle import (
    DEPLOYMENT,
    PIPELINE,
    ChangeReplicas,
    Create,
    Define,
    Delete,
    Deployment,
    Remove,
    Scale,
    decide,
    decide_pipeline,
)
from controlplane.deployments.reconcile import next_start, plan
from controlplane.jobs.lifecycle import JobStatus

AT = datetime(2026, 11, 27, tzinfo=UTC)


def created(replicas: int = 2) -> DeploymentCreated:
    return DeploymentCreated(
        tenant="acme",
        name="dbl",
        model_tenant="acme",
        model_name="double",
        reference="double",
        version=1,
        artifact_sha256="0" * 64,
        entry_point="double:predict",
        resources={"gpus": 0, "cpus": 1.0, "memory_mb": 2048, "image": "img"},
        serving={"max_batch_size": 8, "max_wait_ms": 5.0, "memo": True, "task_timeout_s": 30.0},
        replicas=replicas,
        actor="tenant:acme",
        at=AT,
    )


def run(state: Deployment | None, *commands: object) -> Deployment | None:
    for command in commands:
        state = DEPLOYMENT.fold(state, decide(command, state))  # type: ignore[arg-type]
    return state


def test_replicas_are_numbered_and_retired_by_their_jobs() -> None:
    a, b, c = uuid4(), uuid4(), uuid4()
    state = run(None, Create(created()), ChangeReplicas(AT, start=(a, b)))
    assert state is not None and state.active == (a, b) and state.started == 2
    state = run(state, ChangeReplicas(AT, retire=((a, "its job ended FAILED"),), start=(c,)))
    assert state is not None and state.active == (b, c) and state.started == 3
    # Retiring a job that is not a replica (any more) records nothing.
    assert decide(ChangeReplicas(AT, retire=((a, "again"),)), state) == []


def test_a_deployment_is_created_once_and_again_only_once_its_replicas_stopped() -> None:
    a = uuid4()
    state = run(None, Create(created()), ChangeReplicas(AT, start=(a,)))
    with pytest.raises(Conflict, match="exists"):
        decide(Create(created()), state)
    state = run(state, Delete("tenant:acme", AT))
    assert state is not None and state.deleted
    with pytest.raises(Conflict, match="still stopping"):
        decide(Create(created()), state)
    with pytest.raises(NotFound):
        decide(Scale(3, AT), state)
    with pytest.raises(NotFound):  # no new replicas for a deleted deployment
        decide(ChangeReplicas(AT, start=(uuid4(),)), state)
    state = run(state, ChangeReplicas(AT, retire=((a, "deployment deleted"),)))
    again = run(state, Create(created(replicas=1)))
    assert again is not None and not again.deleted and again.replicas == 1
    # Numbering goes on across re-creations: a new replica never reuses an old job's id.
    assert again.started == 1


def test_scaling_to_the_same_number_records_nothing() -> None:
    state = run(None, Create(created(replicas=2)))
    assert decide(Scale(2, AT), state) == []
    assert run(state, Scale(5, AT)).replicas == 5  # type: ignore[union-attr]


def test_commands_on_no_deployment_are_not_found() -> None:
    with pytest.raises(NotFound):
        decide(Scale(1, AT), None)
    with pytest.raises(NotFound):
        decide(Delete("tenant:acme", AT), None)


def deployment(active: tuple[UUID, ...], replicas: int, deleted: bool = False) -> Deployment:
    state = run(None, Create(created(replicas)), ChangeReplicas(AT, start=active))
    assert state is not None
    return run(state, Delete("x", AT)) if deleted else state  # type: ignore[return-value]


def test_the_plan_replaces_ended_replicas_and_starts_missing_ones() -> None:
    a, b = uuid4(), uuid4()
    todo = plan(deployment((a, b), 3), {a: JobStatus.PROCESSING, b: JobStatus.FAILED}, AT)
    assert todo.retire == ((b, "its job ended FAILED"),)
    assert todo.cancel == ()
    assert todo.start == 2


def test_the_plan_stops_the_newest_replicas_first_when_scaled_down() -> None:
    a, b, c = uuid4(), uuid4(), uuid4()
    running = {job: JobStatus.PROCESSING for job in (a, b, c)}
    todo = plan(deployment((a, b, c), 1), running, AT)
    assert todo.cancel == (b, c)
    assert {job for job, why in todo.retire if why == "scaled down"} == {b, c}
    assert todo.start == 0


def test_the_plan_stops_every_replica_of_a_deleted_deployment() -> None:
    a, b = uuid4(), uuid4()
    todo = plan(deployment((a, b), 2, deleted=True), {a: JobStatus.QUEUED, b: None}, AT)
    assert todo.cancel == (a, b)
    assert todo.start == 0


def test_the_plan_submits_replicas_recorded_but_never_submitted() -> None:
    a, b = uuid4(), uuid4()
    todo = plan(deployment((a, b), 2), {a: JobStatus.PROCESSING, b: None}, AT)
    assert todo.submit == (b,)
    assert todo.start == 0
    assert plan(deployment((a,), 1), {a: JobStatus.PROCESSING}, AT).empty


def test_pipelines_are_defined_once_and_removed() -> None:
    event = PipelineDefined(tenant="acme", name="p", steps=["a", "b"], actor="x", at=AT)
    state = PIPELINE.fold(None, decide_pipeline(Define(event), None))
    assert state is not None and state.steps == ("a", "b")
    assert decide_pipeline(Define(event), state) == []  # the same definition: nothing to do
    other = event.model_copy(update={"steps": ["b"]})
    with pytest.raises(Conflict):
        decide_pipeline(Define(other), state)
    assert PIPELINE.fold(state, decide_pipeline(Remove("x", AT), state)) is None
    with pytest.raises(NotFound):
        decide_pipeline(Remove("x", AT), None)


def test_replicas_that_keep_failing_are_replaced_ever_more_slowly() -> None:
    state = deployment((), 1)
    failed = []
    for _ in range(4):
        job = uuid4()
        state = run(state, ChangeReplicas(AT, start=(job,)))  # type: ignore[assignment]
        failed.append(job)
        todo = plan(state, {job: JobStatus.FAILED}, AT)
        state = run(state, ChangeReplicas(AT, retire=todo.retire))  # type: ignore[assignment]
    assert state.failures == 4
    # Three in a row are replaced at once; past them, the next waits 10 s, then 20 s, ...
    assert next_start(state) == AT + timedelta(seconds=20)
    assert plan(state, {}, AT + timedelta(seconds=19)).start == 0
    assert plan(state, {}, AT + timedelta(seconds=20)).start == 1
    # Asking for another number of replicas starts afresh.
    assert run(state, Scale(2, AT)).failures == 0  # type: ignore[union-attr]
