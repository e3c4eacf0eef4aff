"""The figures of a set of outcomes (the replay's, or the recorded past's), pure.

- Waits: from a job's submission to its first claim; percentiles by nearest rank (p50 of 1, 2,
  3, 4 is 2).
- Makespan: from the first submission to the last end of the jobs reported.
- GPU utilization: the GPU-seconds the replayed jobs' attempts held (claim to end), over the
  GPU-seconds the READY nodes' healthy GPUs offered, both within the makespan.
- Jain's fairness index, (sum x)^2 / (n * sum x^2), over the tenants that had a job waiting at
  some time in the makespan, where x is a tenant's GPU share per unit of weight while it
  waited: the GPU-seconds its jobs held while it had a job waiting, over (its weight * how long
  it had one waiting). 1 when every waiting tenant got GPUs in proportion to its weight, 1/n
  when one got them all. The weights are the policy's (the recorded ones where it names
  none), for the replay and the past alike: one yardstick.
- Start order agreement (Kendall's): the share of pairs of jobs claimed in both that the
  replay claimed in the recorded order. Start time error: the mean of |replay - recorded| over
  their first claims, as a share of the recorded makespan.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections.abc import Iterable, Sequence

from sim.workload import GpuFailed, NodeJoined, NodeLeft, Outcome, Run, Timed

Interval = tuple[float, float]


def percentile(values: Sequence[float], share: float) -> float | None:
    """The nearest-rank percentile (`share` of 1); None of nothing."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(share * len(ordered)) - 1, 0)]


def waits(outcomes: Iterable[Outcome]) -> list[float]:
    return [o.start - o.submitted for o in outcomes if o.start is not None]


def span(outcomes: Sequence[Outcome]) -> Interval | None:
    """From the first submission to the last end (of a job that never ended: of its last
    attempt); None without jobs."""
    if not outcomes:
        return None
    return min(o.submitted for o in outcomes), max(_last(o) for o in outcomes)


def _last(outcome: Outcome) -> float:
    if outcome.end is not None:
        return outcome.end
    return outcome.runs[-1].end if outcome.runs else outcome.submitted


def available_gpu_seconds(changes: Sequence[Timed], window: Interval) -> float:
    """The GPU-seconds the READY nodes' healthy GPUs offered within `window`."""
    start, end = window
    healthy: dict[str, set[str]] = {}
    offered = total = 0.0
    last = start
    for timed in sorted(changes, key=lambda t: t.at):
        at = min(max(timed.at, start), end)
        total += offered * (at - last)
        last = at
        match timed.change:
            case NodeJoined(node=node, gpus=gpus):
                healthy[node] = {gpu.uuid for gpu in gpus if gpu.healthy}
            case GpuFailed(node=node, uuid=uuid):
                healthy.get(node, set()).discard(uuid)
            case NodeLeft(node=node):
                healthy.pop(node, None)
        offered = float(sum(len(gpus) for gpus in healthy.values()))
    return total + offered * (end - last)


def used_gpu_seconds(outcomes: Iterable[Outcome], window: Interval) -> float:
    return sum(o.gpus * _overlap(run, [window]) for o in outcomes for run in o.runs)


def jain_fairness(
    reported: Sequence[Outcome],
    everyone: Sequence[Outcome],
    weights: dict[str, float],
    window: Interval,
) -> float | None:
    """Jain's index of the weighted GPU shares of the tenants while they waited (see the
    module's note); None when no tenant waited, or none got anything while it did."""
    shares = []
    for tenant in sorted({o.tenant for o in reported}):
        waiting = _union(
            (o.submitted, o.start if o.start is not None else (o.end or window[1]))
            for o in reported
            if o.tenant == tenant
        )
        waited = sum(end - start for start, end in _clip(waiting, window))
        if waited <= 0:
            continue
        held = sum(
            o.gpus * _overlap(run, _clip(waiting, window))
            for o in everyone
            if o.tenant == tenant
            for run in o.runs
        )
        shares.append(held / (weights.get(tenant, 1.0) * waited))
    squares = sum(x * x for x in shares)
    if not squares:
        return None
    return sum(shares) ** 2 / (len(shares) * squares)


def start_order_agreement(orders: Sequence[tuple[int, int]]) -> float | None:
    """The share of pairs in the same order, of (recorded, replayed) places; None under two."""
    n = len(orders)
    if n < 2:
        return None
    # Pairs out of order counted as each place comes, against the places before it in a
    # sorted list: 2,000 jobs make two million pairs, too many to look at one by one.
    seen: list[int] = []
    inversions = 0
    for _, mine in sorted(orders):
        inversions += len(seen) - bisect_right(seen, mine)
        insort(seen, mine)
    return 1 - inversions / (n * (n - 1) / 2)


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _clip(intervals: list[Interval], window: Interval) -> list[Interval]:
    clipped = [(max(s, window[0]), min(e, window[1])) for s, e in intervals]
    return [(s, e) for s, e in clipped if e > s]


def _overlap(run: Run, intervals: list[Interval]) -> float:
    """How long `run` overlaps the sorted, disjoint `intervals`."""
    total = 0.0
    k = max(bisect_right(intervals, (run.start, math.inf)) - 1, 0)
    for start, end in intervals[k:]:
        if start >= run.end:
            break
        total += max(min(end, run.end) - max(start, run.start), 0.0)
    return total
