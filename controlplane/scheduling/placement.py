"""Placing a job's learners on nodes' free room: pure, over what nodes can still give."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass
from typing import Protocol, TypeVar


@dataclass(frozen=True, slots=True)
class LearnerAllocation:
    index: int
    node: str
    gpus: list[str]


@dataclass(frozen=True, slots=True)
class Capacity:
    """What a node can still give."""

    node: str
    gpus: list[str]
    cpus: float
    memory_mb: int

    def less(self, learners: Sequence[LearnerAllocation], demand: Demand) -> Capacity:
        """What is left once `learners` (those placed here) have their share."""
        here = [learner for learner in learners if learner.node == self.node]
        used = {gpu for learner in here for gpu in learner.gpus}
        return Capacity(
            self.node,
            [gpu for gpu in self.gpus if gpu not in used],
            self.cpus - len(here) * demand.cpus,
            self.memory_mb - len(here) * demand.memory_mb,
        )


@dataclass(frozen=True, slots=True)
class Demand:
    """What each learner of a job needs, and how many go on a node."""

    learners: int
    gpus: int
    cpus: float
    memory_mb: int
    per_node: int | None = None
    """The manifest's `learners_per_node`: a node takes exactly this many of the job's learners
    or none. None: as many as fit."""


def node_takes(demand: Demand, fitting: int) -> int:
    """How many of a job's learners a node with room for `fitting` of them takes: all that fit,
    or, under `per_node`, that many or none (torchrun's nproc_per_node: every node runs the
    same number of ranks, so a node with room for fewer takes none rather than split the job
    unevenly). The claim's SQL states the same rule."""
    if demand.per_node is None:
        return fitting
    return demand.per_node if fitting >= demand.per_node else 0


def fitting(demand: Demand, node: Capacity, most: int) -> int:
    """How many learners of `demand` fit in `node`'s room, at most `most`."""
    return min(
        len(node.gpus) // demand.gpus if demand.gpus else most,
        times(node.cpus, demand.cpus, most),
        times(node.memory_mb, demand.memory_mb, most),
        most,
    )


def times(free: float, each: float, most: int) -> int:
    """How many times `each` fits in `free`, at most `most` (the learners wanted).

    floor(a / b), as the claim's SQL counts, not a // b: 1.0 // 0.2 is 4 (0.2 is a little over
    a fifth), and a node the SQL offered 5 learners would place 4. Never an error: a quotient
    too large for an int (a tiny `each`, which the manifest's floors refuse but an older
    stored job may hold) counts as `most`, so one job's values cannot stop the judging of all.
    """
    quotient = free / each if each > 0 else math.inf
    if math.isnan(quotient):
        return 0
    return most if quotient >= most else math.floor(quotient)


def place(demand: Demand, nodes: Sequence[Capacity]) -> list[LearnerAllocation] | None:
    """Learners on nodes, in order (the claiming node first): each node takes as many as fit
    (`node_takes`). None when they do not all fit: a job is placed whole or not at all."""
    placed: list[LearnerAllocation] = []
    for node in nodes:
        if len(placed) == demand.learners:
            break  # the rest would take none: at a thousand nodes, most of a placement's time
        fits = node_takes(demand, fitting(demand, node, demand.learners - len(placed)))
        for k in range(max(fits, 0)):
            gpus = node.gpus[k * demand.gpus : (k + 1) * demand.gpus]
            placed.append(LearnerAllocation(len(placed), node.node, gpus))
    return placed if len(placed) == demand.learners else None


class OfferedGpu(Protocol):
    """A GPU as a node offers it (the agent's inventory, a registration's GPU list)."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def healthy(self) -> bool: ...


G = TypeVar("G", bound=OfferedGpu)


def allocatable(gpus: Iterable[G], allocated: Set[str]) -> list[G]:
    """The GPUs a claim may take: healthy ones that are not allocated (UUIDs in `allocated`),
    by index. The `node_capacity` view counts a node's free GPUs the same way."""
    return sorted(
        (gpu for gpu in gpus if gpu.healthy and gpu.uuid not in allocated),
        key=lambda gpu: gpu.index,
    )
