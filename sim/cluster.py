"""The nodes of a replay and the room each can still give, as the `node_capacity` view counts
it: healthy GPUs no learner holds (by index), and the CPUs and memory the live learners leave.
Jobs are known by their number in the replay."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from controlplane.invariants import InvariantBroken
from controlplane.scheduling.placement import Capacity, Demand, LearnerAllocation
from sim.queue import Queue
from sim.workload import NodeJoined


class _Learner(NamedTuple):
    # A tuple: a replay makes one for every learner it starts.
    job: int
    """The job's number in the replay."""
    cpus: float
    memory_mb: int
    gpus: list[str]


class Node:
    def __init__(self, joined: NodeJoined) -> None:
        self.name = joined.node
        self._learners: list[_Learner] = []
        self._capacity: Capacity | None = None
        """What it can give, once asked, until its room changes."""
        self.rejoin(joined)

    def rejoin(self, joined: NodeJoined) -> None:
        """Registered (again: its agent restarted, its learners run on)."""
        self._cpus = joined.cpus
        self._memory_mb = joined.memory_mb
        self._healthy = {gpu.uuid: gpu.index for gpu in joined.gpus if gpu.healthy}
        held = {gpu for learner in self._learners for gpu in learner.gpus}
        self._free = {uuid: index for uuid, index in self._healthy.items() if uuid not in held}
        self._recount()

    def capacity(self) -> Capacity:
        if self._capacity is None:
            gpus = sorted(self._free, key=self._free.__getitem__)
            self._capacity = Capacity(self.name, gpus, self.cpus, self.memory_mb)
        return self._capacity

    def could_take(self, queue: Queue) -> bool:
        """Whether one learner of some queued job fits here: what any claim here needs first.
        (Most often a node has no GPU free, which the queue's least demand says at once.)"""
        free = len(self._free)
        gpus, cpus, memory_mb = queue.least
        if free < gpus or self.cpus < cpus or self.memory_mb < memory_mb:
            return False
        if queue.shapes == 1:
            return True  # the least demand is the one demand
        return any(
            d.gpus <= free and d.cpus <= self.cpus and d.memory_mb <= self.memory_mb
            for d in queue.demands()
        )

    def take(self, job: int, demand: Demand, learner: LearnerAllocation) -> None:
        for gpu in learner.gpus:
            if self._free.pop(gpu, None) is None:
                raise InvariantBroken(f"node {self.name}: GPU {gpu} is not free")
        self._learners.append(_Learner(job, demand.cpus, demand.memory_mb, learner.gpus))
        self._recount()

    def give_back(self, job: int) -> None:
        kept = []
        for learner in self._learners:
            if learner.job != job:
                kept.append(learner)
                continue
            for gpu in learner.gpus:
                if gpu in self._healthy:
                    self._free[gpu] = self._healthy[gpu]
        self._learners = kept
        self._recount()

    def fail_gpu(self, uuid: str) -> None:
        self._healthy.pop(uuid, None)
        self._free.pop(uuid, None)
        self._recount()

    def jobs(self) -> list[int]:
        """The jobs with learners here, each once, in the order they came."""
        return list(dict.fromkeys(learner.job for learner in self._learners))

    def _recount(self) -> None:
        # Summed afresh, as the view sums the live allocations: running totals kept by adding
        # and subtracting fractions of CPUs would drift from the claim's arithmetic.
        self.cpus = self._cpus - sum([learner.cpus for learner in self._learners])
        self.memory_mb = self._memory_mb - sum([learner.memory_mb for learner in self._learners])
        self._capacity = None


class Cluster:
    """The READY nodes, in the order they claim (by name: deterministic)."""

    def __init__(self) -> None:
        self._nodes: dict[str, Node] = {}
        self.ready: list[Node] = []

    def join(self, joined: NodeJoined) -> None:
        node = self._nodes.get(joined.node)
        if node is None:
            self._nodes[joined.node] = Node(joined)
            self.ready = sorted(self._nodes.values(), key=lambda n: n.name)
        else:
            node.rejoin(joined)

    def leave(self, name: str) -> list[int]:
        """The node is gone; the jobs that ran on it."""
        node = self._nodes.pop(name, None)
        if node is None:
            return []
        self.ready = [n for n in self.ready if n is not node]
        return node.jobs()

    def fail_gpu(self, name: str, uuid: str) -> None:
        node = self._nodes.get(name)
        if node is not None:
            node.fail_gpu(uuid)

    def others(self, here: Node) -> list[Capacity]:
        """What the other READY nodes can still give, roomiest first (`other_nodes_capacity`)."""
        rooms = [node.capacity() for node in self.ready if node is not here]
        return sorted(rooms, key=lambda room: (-len(room.gpus), room.node))

    def allocate(self, job: int, demand: Demand, learners: list[LearnerAllocation]) -> None:
        for learner in learners:
            self._nodes[learner.node].take(job, demand, learner)

    def release(self, job: int, nodes: Iterable[str]) -> None:
        """Give back what the job holds on `nodes` (those still READY)."""
        for name in nodes:
            node = self._nodes.get(name)
            if node is not None:
                node.give_back(job)
