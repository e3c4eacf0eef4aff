"""Canaries, pure: the weighted choice counted over a fixed sequence of draws and a seeded random
one, the rollback rule, and the lifecycle's moves (start, weight, promote, roll back, refusals)
and the replicas' plan beside the deployment's own."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest

from controlplane.deployments.canary import Errors, Rollback, rollback_reason, to_canary
from controlplane.deployments.errors import Conflict, InvalidRequest
from controlplane.deployments.events import (
    CanaryPromoted,
    CanaryRolledBack,
    CanaryStarted,
    CanaryWeightSet,
    DeploymentCreated,
    ReplicaRetired,
    ReplicaStarted,
)
from controlplane.deployments.lifecycle import (
    DEPLOYMENT,
    ChangeReplicas,
    Create,
    Delete,
    Deployment,
    DeploymentCommand,
    PromoteCanary,
    RollBackCanary,
    StartCanary,
    decide,
)
from controlplane.deployments.reconcile import plan
from controlplane.jobs.lifecycle import JobStatus

AT = datetime(2026, 11, 29, tzinfo=UTC)
RULE = {"max_error_rate": 0.2, "min_requests": 10, "window_s": 60.0}


def test_a_weight_is_the_share_of_a_fixed_sequence_of_draws() -> None:
    draws = [n / 1000 for n in range(1000)]  # evenly spread over [0, 1)
    for weight in (0, 1, 10, 33, 50, 99, 100):
        assert sum(to_canary(weight, d) for d in draws) == weight * 10


def test_a_seeded_random_draw_splits_by_weight_within_chance() -> None:
    draw = random.Random(35).random
    n = 20_000
    got = sum(to_canary(25, draw()) for _ in range(n))
    # Binomial(20000, 0.25): standard deviation 61; five of them is a failure by chance once in
    # millions of runs.
    assert abs(got - n * 0.25) < 5 * 61


def test_a_draw_outside_its_range_is_a_bug_not_a_route() -> None:
    with pytest.raises(ValueError, match="draw"):
        to_canary(50, 1.0)


def test_the_rule_needs_enough_requests_and_a_rate_past_its_limit() -> None:
    rule = Rollback.of(RULE)
    assert rollback_reason(rule, Errors(finished=9, failed=9)) is None  # too few to say
    assert rollback_reason(rule, Errors(finished=10, failed=2)) is None  # at the limit: stays
    assert rollback_reason(rule, Errors(finished=0, failed=0)) is None
    reason = rollback_reason(rule, Errors(finished=10, failed=3))
    assert reason is not None
    assert "0.300" in reason and "3 of 10" in reason and "60s" in reason and "0.2" in reason


def created() -> DeploymentCreated:
    return DeploymentCreated(
        tenant="acme",
        name="dbl",
        model_tenant="acme",
        model_name="double",
        reference="double:1",
        version=1,
        artifact_sha256="1" * 64,
        entry_point="double:predict",
        resources={"gpus": 0, "cpus": 1.0, "memory_mb": 2048, "image": "img"},
        serving={"max_batch_size": 8, "max_wait_ms": 5.0, "memo": True, "task_timeout_s": 30.0},
        replicas=2,
        actor="tenant:acme",
        at=AT,
    )


def canary(weight: int = 10, version: int = 2, replicas: int = 1) -> StartCanary:
    return StartCanary(
        CanaryStarted(
            reference=f"double:{version}",
            version=version,
            artifact_sha256="2" * 64,
            entry_point="double:predict",
            weight=weight,
            replicas=replicas,
            rollback=RULE,
            actor="tenant:acme",
            at=AT,
        )
    )


def run(state: Deployment | None, *commands: DeploymentCommand) -> Deployment:
    for command in commands:
        state = DEPLOYMENT.fold(state, decide(command, state))
    assert state is not None
    return state


def serving() -> tuple[Deployment, tuple[UUID, ...], tuple[UUID, ...]]:
    """A deployment of version 1 on two replicas, with a canary of version 2 on one."""
    a, b, c = uuid4(), uuid4(), uuid4()
    state = run(
        None,
        Create(created()),
        ChangeReplicas(AT, start=(a, b)),
        canary(),
        ChangeReplicas(AT, start_canary=(c,)),
    )
    return state, (a, b), (c,)


def test_a_canary_runs_beside_the_deployment_on_replicas_numbered_on() -> None:
    state, own, beside = serving()
    assert state.active == own and state.version == 1
    assert state.canary is not None
    assert state.canary.active == beside and state.canary.version == 2
    assert state.canary.weight == 10 and state.started == 3
    started = decide(ChangeReplicas(AT, start_canary=(uuid4(),)), state)
    assert isinstance(started[0], ReplicaStarted) and started[0].canary and started[0].number == 4


def test_starting_it_again_moves_its_weight_only() -> None:
    state, _, _ = serving()
    assert decide(canary(weight=10), state) == []  # as it is already
    moved = decide(canary(weight=60), state)
    assert [type(e) for e in moved] == [CanaryWeightSet]
    assert isinstance(moved[0], CanaryWeightSet) and moved[0].previous == 10
    assert run(state, canary(weight=60)).canary is not None
    with pytest.raises(Conflict, match="version 2 already"):
        decide(canary(version=3), state)
    with pytest.raises(Conflict, match="only its weight"):
        decide(canary(weight=60, replicas=2), state)


def test_a_canary_of_the_deployments_own_version_is_refused_naming_the_field() -> None:
    state = run(None, Create(created()))
    with pytest.raises(InvalidRequest) as refused:
        decide(canary(version=1), state)
    assert refused.value.field == "model"


def test_promoting_makes_the_canary_the_deployment_and_retires_the_old_replicas() -> None:
    state, own, beside = serving()
    events = decide(PromoteCanary("tenant:acme", AT), state)
    assert [type(e) for e in events] == [ReplicaRetired, ReplicaRetired, CanaryPromoted]
    assert {e.job_id for e in events if isinstance(e, ReplicaRetired)} == set(own)
    promoted = DEPLOYMENT.fold(state, events)
    assert promoted is not None and promoted.canary is None
    assert promoted.version == 2 and promoted.artifact_sha256 == "2" * 64
    assert promoted.reference == "double:2" and promoted.active == beside
    # Its owner's two replicas stay what it asks for: one more of the new version.
    todo = plan(promoted, dict.fromkeys(promoted.active, JobStatus.PROCESSING), AT)
    assert todo.start == 1 and todo.start_canary == 0 and not todo.retire
    with pytest.raises(Conflict, match="no canary"):
        decide(PromoteCanary("tenant:acme", AT), promoted)


def test_a_rollback_retires_the_canary_and_a_second_one_is_refused() -> None:
    state, own, beside = serving()
    command = RollBackCanary(
        2, "error rate 0.5", "system:deployments", AT, failed=5, finished=10, window_s=60.0
    )
    events = decide(command, state)
    assert [type(e) for e in events] == [ReplicaRetired, CanaryRolledBack]
    rolled = events[1]
    assert isinstance(rolled, CanaryRolledBack)
    assert (rolled.reason, rolled.failed, rolled.finished, rolled.window_s) == (
        "error rate 0.5",
        5,
        10,
        60.0,
    )
    back = DEPLOYMENT.fold(state, events)
    assert back is not None and back.canary is None and back.active == own
    assert back.version == 1 and back.failures == 0
    # Another control plane's sweep read the same figures: the stream refuses it.
    with pytest.raises(Conflict, match="no canary"):
        decide(command, back)
    # One decided on an older canary's figures does not stop a newer one.
    again = run(back, canary(version=3))
    with pytest.raises(Conflict, match="version 3, not 2"):
        decide(command, again)
    assert beside[0] not in back.active


def test_the_plan_keeps_the_canarys_replicas_its_own_number() -> None:
    state, own, beside = serving()
    running = dict.fromkeys((*own, *beside), JobStatus.PROCESSING)
    assert plan(state, running, AT).empty
    ended = plan(state, {**running, beside[0]: JobStatus.FAILED}, AT)
    assert ended.retire == ((beside[0], "its job ended FAILED"),)
    assert ended.start == 0 and ended.start_canary == 1
    failed = run(state, ChangeReplicas(AT, retire=((beside[0], "its job ended FAILED"),)))
    assert failed.canary is not None and failed.canary.active == ()
    assert failed.failures == 0  # the canary's failures are not the deployment's backoff


def test_deleting_stops_the_canary_too_and_no_new_deployment_comes_before() -> None:
    state, own, beside = serving()
    deleted = run(state, Delete("tenant:acme", AT))
    running = dict.fromkeys((*own, *beside), JobStatus.PROCESSING)
    todo = plan(deleted, running, AT)
    assert set(todo.cancel) == {*own, *beside} and todo.start_canary == 0
    stopped_own = run(deleted, ChangeReplicas(AT, retire=tuple((j, "deleted") for j in own)))
    with pytest.raises(Conflict, match="still stopping"):
        decide(Create(created()), stopped_own)


def test_a_canary_whose_replicas_keep_failing_is_rolled_back_with_the_last_one() -> None:
    state, own, _ = serving()
    state = run(state, ChangeReplicas(AT, start_canary=(uuid4(),)))  # two canary replicas now
    assert state.canary is not None
    first, second = state.canary.active
    failed = "its job ended FAILED"
    # Two failures in a row, each replaced: the canary stays.
    state = run(state, ChangeReplicas(AT, retire=((first, failed),), start_canary=(uuid4(),)))
    assert state.canary is not None and state.canary.failures == 1
    third = state.canary.active[-1]
    state = run(state, ChangeReplicas(AT, retire=((third, failed),), start_canary=(uuid4(),)))
    assert state.canary is not None and state.canary.failures == 2
    fourth = state.canary.active[-1]
    # The third: rolled back in the same append, its other replica retired, none started.
    events = decide(
        ChangeReplicas(AT, retire=((fourth, failed),), start=(uuid4(),), start_canary=(uuid4(),)),
        state,
    )
    assert [type(e) for e in events] == [
        ReplicaRetired,
        ReplicaRetired,
        CanaryRolledBack,
        ReplicaStarted,
    ]
    assert {e.job_id for e in events if isinstance(e, ReplicaRetired)} == {fourth, second}
    rolled = events[2]
    assert isinstance(rolled, CanaryRolledBack) and rolled.actor == "system:canary"
    assert "failed 3 times in a row" in rolled.reason
    started = events[3]
    assert isinstance(started, ReplicaStarted) and not started.canary
    back = DEPLOYMENT.fold(state, events)
    assert back is not None and back.canary is None and back.failures == 0
    assert back.active == (*own, started.job_id)


def test_a_canary_replica_stopped_for_another_reason_resets_its_failures() -> None:
    state, _, beside = serving()
    state = run(state, ChangeReplicas(AT, retire=((beside[0], "its job ended FAILED"),)))
    assert state.canary is not None and state.canary.failures == 1
    c = uuid4()
    state = run(state, ChangeReplicas(AT, start_canary=(c,)))
    state = run(state, ChangeReplicas(AT, retire=((c, "unresponsive"),)))
    assert state.canary is not None and state.canary.failures == 0
