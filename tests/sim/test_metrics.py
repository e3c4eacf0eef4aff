"""The report's figures on outcomes made by hand: percentiles, GPUs offered and used, Jain's
index, and the start order's agreement against counting every pair."""

from __future__ import annotations

import itertools
import random
from uuid import UUID

import pytest

from sim.metrics import (
    available_gpu_seconds,
    jain_fairness,
    percentile,
    start_order_agreement,
    used_gpu_seconds,
)
from sim.workload import Gpu, GpuFailed, NodeJoined, NodeLeft, Outcome, Run, Timed


def outcome(tenant: str, submitted: float, *runs: tuple[float, float], gpus: int = 1) -> Outcome:
    held = tuple(Run(start, end) for start, end in runs)
    return Outcome(UUID(int=1), tenant, gpus, submitted, held, held[-1].end if held else None, 0)


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0
    assert percentile([float(k) for k in range(1, 101)], 0.95) == 95.0
    assert percentile([7.0], 0.95) == 7.0
    assert percentile([], 0.5) is None


def test_gpus_offered_follow_nodes_joining_failing_and_leaving() -> None:
    gpus = tuple(Gpu(i, f"g{i}", healthy=i < 3) for i in range(4))  # one unhealthy already
    changes = (
        Timed(0, NodeJoined("n", 8, 1024, gpus)),
        Timed(10, GpuFailed("n", "g0")),
        Timed(20, NodeLeft("n")),
    )
    # 3 GPUs for 5 s, 2 for 10 s, none after 20 s.
    assert available_gpu_seconds(changes, (5, 30)) == 3 * 5 + 2 * 10
    used = [outcome("a", 0, (0, 8), gpus=2), outcome("a", 0, (12, 40))]
    assert used_gpu_seconds(used, (5, 30)) == 2 * 3 + 18


def test_jain_is_one_when_waiting_tenants_get_gpus_by_weight_and_falls_when_not() -> None:
    window = (0.0, 100.0)
    # a and b wait throughout (a job each never started); b, of weight 2, holds twice a's GPUs.
    fair = [
        outcome("a", 0),
        outcome("a", 0, (0, 100)),
        outcome("b", 0),
        outcome("b", 0, (0, 100), gpus=2),
    ]
    assert jain_fairness(fair, fair, {"a": 1, "b": 2}, window) == pytest.approx(1.0)
    # Weighed as equals, b has twice a's share: (1 + 2)^2 / (2 * (1 + 4)).
    assert jain_fairness(fair, fair, {"a": 1, "b": 1}, window) == pytest.approx(0.9)
    starved = [outcome("a", 0), outcome("b", 0), outcome("b", 0, (0, 100))]
    assert jain_fairness(starved, starved, {"a": 1, "b": 1}, window) == pytest.approx(0.5)
    nobody_waited = [outcome("a", 0, (0, 100))]
    assert jain_fairness(nobody_waited, nobody_waited, {"a": 1}, window) is None


def test_the_start_order_agreement_counts_the_pairs_in_the_same_order() -> None:
    rng = random.Random(3)
    for n in (2, 3, 10, 60):
        replayed = list(range(n))
        rng.shuffle(replayed)
        orders = list(enumerate(replayed))
        pairs = list(itertools.combinations(orders, 2))
        same = sum((a[0] < b[0]) == (a[1] < b[1]) for a, b in pairs)
        assert start_order_agreement(orders) == pytest.approx(same / len(pairs))
    assert start_order_agreement([(0, 5)]) is None
