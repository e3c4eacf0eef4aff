"""The jobs a replay may claim now, indexed for claims: by tenant and demand, each group in the
policy's order. A claim offers `claim_order` only the first few of each group, which is where
everything it could choose lies: whether a job fits and whether its tenant's quota allows it
depend on its tenant and demand alone, so within a group the jobs a tenant offers are the first
ones; and `claim_order` offers at most `per_tenant` jobs of each tenant. So it chooses the same
jobs in the same order as over the whole queue (tests/sim/test_queue.py holds it to that)."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from controlplane.scheduling.claim_order import QueuedJob, order_key
from controlplane.scheduling.placement import Demand
from controlplane.scheduling.policy import Order

_Shape = tuple[int, int, float, int]
"""A demand as a plain tuple (learners, GPUs, CPUs, memory): hashed without a Python call,
where a claim's every step looks one up."""


class Queue:
    """Which of a replay's jobs (by their index in `jobs`) are queued now."""

    def __init__(self, order: Order, jobs: Sequence[QueuedJob]) -> None:
        key: Callable[[QueuedJob], tuple[Any, ...]] = order_key(order)
        self._jobs = jobs
        # Each job's place in the order and its group, worked out once: a job enters and
        # leaves the queue at least once each.
        self._keys = [key(job) for job in jobs]
        self._groups_of = [(job.tenant, _shape(job.demand)) for job in jobs]
        self._groups: dict[tuple[str, _Shape], list[tuple[tuple[Any, ...], int]]] = {}
        self._demands: dict[_Shape, tuple[Demand, int]] = {}
        self.least: tuple[int, float, int] = (0, 0.0, 0)
        """The fewest GPUs, CPUs and MiB any queued job's learner needs (each apart): a node
        with less of one takes nothing."""
        self.waiting = 0
        """How many jobs are queued."""
        self.shapes = 0
        """How many different demands they make."""

    def add(self, index: int) -> None:
        self.waiting += 1
        group = self._groups_of[index]
        # Keys end with the job's id: never equal, so the index after one is never compared.
        insort(self._groups.setdefault(group, []), (self._keys[index], index))
        shape = group[1]
        demand, count = self._demands.get(shape, (self._jobs[index].demand, 0))
        self._demands[shape] = (demand, count + 1)
        if not count:
            self._floor()

    def remove(self, index: int) -> None:
        self.waiting -= 1
        group = self._groups_of[index]
        entries = self._groups[group]
        del entries[bisect_left(entries, (self._keys[index], index))]
        if not entries:
            del self._groups[group]
        shape = group[1]
        demand, count = self._demands[shape]
        if count > 1:
            self._demands[shape] = (demand, count - 1)
        else:
            del self._demands[shape]
            self._floor()

    def heads(self, count: int) -> list[QueuedJob]:
        """The first `count` jobs of every group."""
        jobs = self._jobs
        return [jobs[index] for group in self._groups.values() for _, index in group[:count]]

    def demands(self) -> Iterable[Demand]:
        """The demands of the queued jobs, each once."""
        return (demand for demand, _ in self._demands.values())

    def _floor(self) -> None:
        shapes = self._demands.keys()
        self.shapes = len(shapes)
        if shapes:
            self.least = (
                min(s[1] for s in shapes),
                min(s[2] for s in shapes),
                min(s[3] for s in shapes),
            )


def _shape(demand: Demand) -> _Shape:
    return (demand.learners, demand.gpus, demand.cpus, demand.memory_mb)
