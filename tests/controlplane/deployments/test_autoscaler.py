"""The autoscaler's rules (a pure function) and its place in the deployment's lifecycle: each
move an event with the load that drove it, tested without a database."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.deployments.autoscaler import Load, Policy, desired_replicas
from controlplane.deployments.errors import Conflict
from controlplane.deployments.events import (
    DeploymentAutoscaled,
    DeploymentCreated,
    DeploymentScaled,
)
from controlplane.deployments.lifecycle import Autoscale, Create, Scale, SetAutoscaling, decide
from controlplane.events.types import EventRegistry
from tests.controlplane.deployments.test_lifecycle import AT, created, run

POLICY = Policy(min_replicas=0, max_replicas=8, target_in_flight=2.0, scale_down_delay_s=30.0)
IDLE = Load(unfinished=0, waiting=0, mean_in_flight=0.0, idle_s=3600.0)


def busy(in_flight: float, *, waiting: int = 0) -> Load:
    return Load(unfinished=waiting, waiting=waiting, mean_in_flight=in_flight, idle_s=0.0)


def test_it_scales_up_at_once_to_what_the_load_needs() -> None:
    assert desired_replicas(POLICY, busy(7.0), current=1, since_change_s=0.0) == 4
    assert desired_replicas(POLICY, busy(100.0), current=1, since_change_s=0.0) == 8  # max
    # A burst queued a moment ago counts whole, before the mean has caught up with it.
    burst = Load(unfinished=10, waiting=10, mean_in_flight=0.5, idle_s=0.0)
    assert desired_replicas(POLICY, burst, current=1, since_change_s=0.0) == 5


def test_it_scales_down_only_once_the_last_change_is_the_delay_old() -> None:
    assert desired_replicas(POLICY, busy(1.0), current=4, since_change_s=29.0) == 4
    assert desired_replicas(POLICY, busy(1.0), current=4, since_change_s=30.0) == 1
    # Idle for the whole delay, it need not wait for the last change to age as well.
    assert desired_replicas(POLICY, IDLE, current=4, since_change_s=1.0) == 0


def test_from_zero_a_waiting_request_starts_one_replica() -> None:
    waiting = Load(unfinished=1, waiting=1, mean_in_flight=0.01, idle_s=0.0)
    assert desired_replicas(POLICY, waiting, current=0, since_change_s=0.0) == 1


def test_to_zero_only_when_idle_for_the_delay_and_min_is_zero() -> None:
    quiet = replace(IDLE, idle_s=29.0)
    assert desired_replicas(POLICY, quiet, current=1, since_change_s=600.0) == 1
    assert desired_replicas(POLICY, IDLE, current=1, since_change_s=600.0) == 0
    assert desired_replicas(POLICY, IDLE, current=3, since_change_s=600.0) == 0
    kept = replace(POLICY, min_replicas=1)
    assert desired_replicas(kept, IDLE, current=3, since_change_s=600.0) == 1
    # At zero, a memo hit (a row, no replica needed) starts nothing.
    hit = Load(unfinished=0, waiting=0, mean_in_flight=0.001, idle_s=0.5)
    assert desired_replicas(POLICY, hit, current=0, since_change_s=0.0) == 0


policies = st.builds(
    lambda low, extra, target, delay: Policy(low, low + extra, target, delay),
    st.integers(0, 64),
    st.integers(0, 64),
    st.floats(0.01, 1000.0),
    st.floats(1.0, 3600.0),
).filter(lambda p: p.max_replicas >= 1)
loads = st.builds(
    lambda unfinished, waiting, mean, idle: Load(
        unfinished, min(waiting, unfinished), mean, 0.0 if unfinished else idle
    ),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.floats(0.0, 10_000.0),
    st.floats(0.0, 10_000.0),
)
currents = st.integers(0, 128)
sinces = st.floats(0.0, 10_000.0)


@given(policies, loads, currents, sinces)
def test_always_within_bounds(policy: Policy, load: Load, current: int, since: float) -> None:
    replicas = desired_replicas(policy, load, current, since)
    assert policy.min_replicas <= replicas <= policy.max_replicas


@given(policies, loads, currents, sinces)
def test_never_zero_while_work_waits_or_runs(
    policy: Policy, load: Load, current: int, since: float
) -> None:
    if load.unfinished:
        assert desired_replicas(policy, load, current, since) >= 1


@given(policies, loads, currents, sinces)
def test_never_fewer_than_the_load_needs_and_never_down_too_soon(
    policy: Policy, load: Load, current: int, since: float
) -> None:
    replicas = desired_replicas(policy, load, current, since)
    needed = math.ceil(load.in_flight / policy.target_in_flight)
    if current or load.unfinished:  # from none, only a request that waits starts one
        assert replicas >= min(needed, policy.max_replicas)
    if since < policy.scale_down_delay_s and load.idle_s < policy.scale_down_delay_s:
        assert replicas >= min(current, policy.max_replicas)


@given(policies, loads, sinces)
def test_the_same_load_twice_asks_for_the_same(policy: Policy, load: Load, since: float) -> None:
    """No flapping: once there, the decision holds while the load does."""
    first = desired_replicas(policy, load, policy.min_replicas, since)
    assert desired_replicas(policy, load, first, since) == first


def autoscaled() -> DeploymentCreated:
    spec = {
        "min_replicas": 0,
        "max_replicas": 4,
        "target_in_flight": 2.0,
        "scale_down_delay_s": 30.0,
    }
    return created(replicas=0).model_copy(update={"autoscaling": spec})


def test_each_move_is_an_event_with_the_load_that_drove_it() -> None:
    state = run(None, Create(autoscaled()))
    assert state is not None
    events = decide(Autoscale(3, in_flight=5.5, waiting=2, idle_s=0.0, at=AT), state)
    assert events == [
        DeploymentAutoscaled(replicas=3, previous=0, in_flight=5.5, waiting=2, idle_s=0.0, at=AT)
    ]
    state = run(state, Autoscale(3, 5.5, 2, 0.0, AT))
    assert state is not None and state.replicas == 3
    assert decide(Autoscale(3, 5.5, 2, 0.0, AT), state) == []  # already there


def test_a_move_decided_under_wider_bounds_lands_within_the_bounds_in_force() -> None:
    """A sweep decides its number before its event is in; its owner narrowed the bounds
    meanwhile, and the retry decides again against them (found by review)."""
    state = run(None, Create(autoscaled()))
    assert state is not None and state.autoscaling is not None
    narrowed = run(
        state, SetAutoscaling({**state.autoscaling, "max_replicas": 2}, "tenant:acme", AT)
    )
    assert narrowed is not None
    [move] = decide(Autoscale(10, 25.0, 9, 0.0, AT), narrowed)
    assert isinstance(move, DeploymentAutoscaled) and move.replicas == 2
    at_two = run(narrowed, Autoscale(10, 25.0, 9, 0.0, AT))
    assert decide(Autoscale(10, 25.0, 9, 0.0, AT), at_two) == []  # at its maximum already


def test_an_autoscaled_deployment_refuses_a_fixed_number_and_a_fixed_one_autoscaling() -> None:
    state = run(None, Create(autoscaled()))
    with pytest.raises(Conflict, match="autoscaled"):
        decide(Scale(2, AT), state)
    fixed = run(None, Create(created()))
    assert decide(Autoscale(5, 9.0, 0, 0.0, AT), fixed) == []


def test_its_owner_turns_autoscaling_off_and_on_each_an_event() -> None:
    state = run(None, Create(autoscaled()))
    assert state is not None and state.autoscaling is not None
    later = AT + timedelta(seconds=5)
    off = run(state, SetAutoscaling(None, "tenant:acme", later))
    assert off is not None and off.autoscaling is None and off.updated_at == later
    assert decide(SetAutoscaling(None, "tenant:acme", later), off) == []  # off already
    assert decide(Scale(2, AT), off) == [DeploymentScaled(replicas=2, at=AT)]
    bounds = {**(state.autoscaling or {}), "max_replicas": 8}
    on = run(off, SetAutoscaling(bounds, "tenant:acme", later))
    assert on is not None and on.autoscaling == bounds


def test_a_deployment_created_before_autoscaling_reads_as_fixed() -> None:
    registry = EventRegistry((DeploymentCreated,))
    data = created().model_dump(mode="json", exclude={"autoscaling"})
    event = registry.decode("DeploymentCreated", 2, data)
    assert isinstance(event, DeploymentCreated) and event.autoscaling is None
