"""How many replicas an autoscaled deployment should have, from its load: a pure function, so
its rules are tested (with hypothesis) without a database. The controller's sweep reads the
load (`autoscaled_loads` in queries.sql), asks `desired_replicas`, and records each change as
a `DeploymentAutoscaled` event.

The load is read from the rows every request leaves in `serving_tasks`, whichever path it took:
a queued task is a row from the moment it is accepted, and a direct prediction's row is written
moments after its answer (counting.py), with the instant it arrived. So `in_flight` is the
larger of the tasks queued or running now and the mean number in flight over the last
LOOK_BACK_S (each task's time in flight within the window, summed, over the window). Nothing
is written for it: no gauge per control plane, no write on a request's path, and every control
plane's direct predictions count, since their rows are all in one table. The price: a direct
prediction is seen once answered, so a scale-up follows direct load by about one request's
duration; while none is running, a request that finds no replica is queued as a row, which the
next sweep sees at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

LOOK_BACK_S = 1.0
"""The window the mean in flight is taken over: short, so that scaling up follows the load
within a few sweeps; scaling down waits `scale_down_delay_s` anyway."""


@dataclass(frozen=True, slots=True)
class Policy:
    """An `Autoscaling` spec as the deployment's stream holds it."""

    min_replicas: int
    max_replicas: int
    target_in_flight: float
    scale_down_delay_s: float

    @classmethod
    def of(cls, spec: dict[str, Any]) -> Policy:
        return cls(
            min_replicas=spec["min_replicas"],
            max_replicas=spec["max_replicas"],
            target_in_flight=spec["target_in_flight"],
            scale_down_delay_s=spec["scale_down_delay_s"],
        )


@dataclass(frozen=True, slots=True)
class Load:
    """A deployment's requests, as its rows in `serving_tasks` say."""

    unfinished: int
    """Tasks queued or running now."""
    waiting: int
    """Of those, queued: waiting for a replica to take them."""
    mean_in_flight: float
    """Requests in flight on average over the last LOOK_BACK_S, answered ones included."""
    idle_s: float
    """Seconds since a request last came or was in flight (0 while one is)."""

    @property
    def in_flight(self) -> float:
        return max(float(self.unfinished), self.mean_in_flight)


def desired_replicas(policy: Policy, load: Load, current: int, since_change_s: float) -> int:
    """The replicas to have now, given `current` and the seconds since they last changed.

    Up at once to what the load needs at `target_in_flight` each (at least one while any request
    waits or runs); down only once the last change is `scale_down_delay_s` old or the deployment
    has been idle that long, and to none only once it has been idle that long; always within
    [min, max]."""
    needed = math.ceil(load.in_flight / policy.target_in_flight)
    if load.unfinished:
        needed = max(needed, 1)
    elif current == 0:
        # With none running, what was answered needed no replica (the memo answered it): only
        # a request that waits starts one.
        needed = 0
    wanted = _bounded(policy, needed)
    delay = policy.scale_down_delay_s
    if wanted < current and since_change_s < delay and load.idle_s < delay:
        # Too soon after the last change: a load that dipped may come back (idle for the whole
        # delay, it has not).
        wanted = current
    if wanted == 0 and load.idle_s < delay:
        wanted = min(current, 1)  # not idle long enough to stop the last replica
    return _bounded(policy, wanted)


def _bounded(policy: Policy, replicas: int) -> int:
    return min(policy.max_replicas, max(policy.min_replicas, replicas))
