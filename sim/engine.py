"""The replay: a workload run under a policy in virtual time, deterministic.

At every instant something changes (a submission, an attempt's end, a backoff's end, a
cancellation, a node joining or leaving, a GPU failing, a tenant's share), the changes of that
instant are applied in a fixed order (RELEASE to REQUEUE below), and then each READY node, by
name, claims as its agent does (`controlplane/agents/claims.py`): `claim_order` chooses up to
CLAIM_BATCH jobs, which it takes in order while they fit together, placing each with `place`
(on this node, or, a job of several learners, on the others too, roomiest first, after which it
takes no more), again until it takes nothing.

An attempt holds its GPUs from its claim for its recorded run time and then the workload's
release delay; the job then ends, or (a recorded restart) waits out its backoff back in the
queue and runs its next attempt. A node that leaves ends the attempts running on it at once:
their jobs go back to the queue (the lifecycle manager restarts a lost node's jobs without
backoff) to run the rest of that attempt."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from datetime import timedelta

from controlplane.invariants import InvariantBroken
from controlplane.scheduling.claim_order import (
    CLAIM_BATCH,
    QueuedJob,
    TenantShare,
    claim_order,
)
from controlplane.scheduling.placement import Demand, LearnerAllocation, place
from sim.cluster import Cluster, Node
from sim.policy import Policy
from sim.queue import Queue
from sim.workload import (
    Attempt,
    GpuFailed,
    JobSpec,
    NodeJoined,
    NodeLeft,
    Outcome,
    Run,
    TenantSet,
    Workload,
    gpus_of,
)

# What happens at an instant, in the order it is applied within it: room comes back first,
# then the cluster and the tenants change, then jobs leave and enter the queue. Plain numbers:
# an enum's members are looked up thousands of times a replay, each far slower than a global.
RELEASE, CHANGE, STOP, SUBMIT, REQUEUE = range(5)


@dataclass(slots=True)
class _Job:
    """A job's state in the replay."""

    index: int
    spec: JobSpec
    attempts: list[Attempt]
    """The attempts still to run, the current one first."""
    gpus: int
    """What it holds while it runs, all learners'."""
    token: int = 0
    """Moves on at each claim, stop and restart: a timed event of the job carrying an older
    one is stale."""
    queued: bool = False
    nodes: list[str] = field(default_factory=list)
    """Where its running attempt's learners are; empty when none runs."""
    run_start: float = 0.0
    run_end: float = math.inf
    """When the running attempt ends (its GPUs go back a release delay later)."""
    runs: list[Run] = field(default_factory=list)
    order: int | None = None
    end: float | None = None


_Timed = tuple[float, int, int, int, int]
"""(instant, kind, sequence, index, token): the sequence orders events of one instant and kind
(the past's as logged, the replay's as scheduled); index is a job's, or a change's; token, a
job's when the replay scheduled it."""


def simulate(workload: Workload, policy: Policy) -> tuple[Outcome, ...]:
    """What becomes of each job of `workload` under `policy`, in the workload's order."""
    return _Replay(workload, policy).run()


class _Replay:
    def __init__(self, workload: Workload, policy: Policy) -> None:
        self._workload = workload
        self._policy = policy
        self._delay = workload.release_delay_s
        self._cluster = Cluster()
        self._queue = Queue(policy.claim.order, [spec.queued for spec in workload.jobs])
        self._tenants: dict[str, tuple[float, int | None]] = {}
        self._held: dict[str, int] = {}
        self._weighed: dict[tuple[int, ...], list[TenantShare]] = {}
        self._jobs = [
            _Job(k, spec, list(spec.attempts), gpus_of(spec))
            for k, spec in enumerate(workload.jobs)
        ]
        self._offered = {id(job.spec.queued): job for job in self._jobs}
        """Jobs by their queue rows, which the queue hands back as they are: by identity."""
        self._claims = 0
        # Events of one instant and kind keep the log's order: their index is their sequence.
        recorded = [(t.at, CHANGE, k, k, 0) for k, t in enumerate(workload.changes)]
        for job in self._jobs:
            recorded.append((job.spec.submitted, SUBMIT, job.index, job.index, 0))
            if job.spec.stop is not None:
                recorded.append((job.spec.stop, STOP, job.index, job.index, 0))
        recorded.sort()
        self._recorded: list[_Timed] = recorded
        """What the past says happens, in order; `_due` what the replay makes happen."""
        self._due: list[_Timed] = []
        self._sequence = 0

    def run(self) -> tuple[Outcome, ...]:
        recorded, due = self._recorded, self._due
        k, n = 0, len(recorded)
        while k < n or due:
            now = due[0][0] if due and (k == n or due[0] < recorded[k]) else recorded[k][0]
            while True:  # everything of this instant, the two lists merged in order
                if due and due[0][0] == now and (k == n or due[0] < recorded[k]):
                    _, kind, _, index, token = heapq.heappop(due)
                elif k < n and recorded[k][0] == now:
                    _, kind, _, index, token = recorded[k]
                    k += 1
                else:
                    break
                if kind == CHANGE:
                    self._change(now, index)
                else:
                    self._job_event(now, kind, self._jobs[index], token)
            if self._queue.waiting:
                self._claim_round(now)
        return tuple(self._outcome(job) for job in self._jobs)

    def _schedule(self, instant: float, kind: int, job: _Job) -> None:
        self._sequence += 1
        heapq.heappush(self._due, (instant, kind, self._sequence, job.index, job.token))

    def _job_event(self, now: float, kind: int, job: _Job, token: int) -> None:
        if kind == SUBMIT:
            if job.end is None:  # else stopped at the instant it came
                self._enqueue(job)
        elif kind == STOP:
            self._stop(now, job)
        elif token == job.token:  # a release or requeue still due
            if kind == RELEASE:
                self._release(now, job)
            else:
                self._enqueue(job)

    # The cluster and the tenants.

    def _change(self, now: float, index: int) -> None:
        match self._workload.changes[index].change:
            case NodeJoined() as joined:
                self._cluster.join(joined)
            case GpuFailed(node=node, uuid=uuid):
                self._cluster.fail_gpu(node, uuid)
            case NodeLeft(node=node):
                for index in self._cluster.leave(node):
                    self._restart(now, self._jobs[index])
            case TenantSet(name=name, weight=weight, gpu_quota=quota):
                self._tenants[name] = (self._policy.weight(name, weight), quota)
                self._held.setdefault(name, 0)
                self._weighed.clear()

    # Claims.

    def _shares(self) -> list[TenantShare]:
        """The tenants as a claim weighs them, made once for each way they hold GPUs (the
        cluster goes back to the same few ways over and over)."""
        held = tuple(self._held.values())
        shares = self._weighed.get(held)
        if shares is None:
            shares = self._weighed[held] = [
                TenantShare(name, *self._tenants[name], gpus)
                for name, gpus in zip(self._held, held, strict=True)
            ]
        return shares

    def _claim_round(self, now: float) -> None:
        queue = self._queue
        # No node joins or leaves meanwhile: the list of READY nodes stays as it is.
        for node in self._cluster.ready:
            while queue.waiting and node.could_take(queue):
                if not self._claim(now, node):
                    break

    def _claim(self, now: float, node: Node) -> bool:
        """One claim by `node`, as `claims.claim` makes it; whether it took anything."""
        here = node.capacity()
        ready = [here if other is node else other.capacity() for other in self._cluster.ready]
        tenants = self._shares()
        per_tenant = min(CLAIM_BATCH, max(len(here.gpus), 1))
        chosen = claim_order(
            node.name,
            ready,
            tenants,
            self._queue.heads(per_tenant),
            limit=CLAIM_BATCH,
            now=self._workload.origin + timedelta(seconds=now),
            policy=self._policy.claim,
        )
        room, left = here, len(here.gpus)
        spent: tuple[list[LearnerAllocation], Demand] | None = None
        taken: list[tuple[QueuedJob, list[LearnerAllocation]]] = []
        for queued in chosen:
            demand = queued.demand
            if left < demand.learners * demand.gpus and taken:
                continue  # as below, known without placing it: too few GPUs are left
            if spent is not None:
                room, spent = room.less(*spent), None  # what the jobs taken before it leave
            learners = place(demand, [room])
            if learners is None and taken:
                continue  # it fits the node alone, but not beside the jobs taken before it
            if learners is None:
                learners = place(demand, [room, *self._cluster.others(node)])
                if learners is None:
                    raise InvariantBroken(f"job {queued.job_id} was offered but cannot be placed")
            taken.append((queued, learners))
            # `place` fills the claiming node first: a job that spans nodes ends elsewhere.
            if learners[-1].node != node.name:
                break  # placed on other nodes too: take no more now
            spent = (learners, demand)
            left -= demand.learners * demand.gpus
        for queued, learners in taken:
            self._start(now, self._offered[id(queued)], learners)
        return bool(taken)

    # A job's attempts.

    def _enqueue(self, job: _Job) -> None:
        job.queued = True
        self._queue.add(job.index)

    def _start(self, now: float, job: _Job, learners: list[LearnerAllocation]) -> None:
        queued = job.spec.queued
        job.queued = False
        self._queue.remove(job.index)
        self._cluster.allocate(job.index, queued.demand, learners)
        self._held[queued.tenant] += job.gpus
        job.nodes = list(dict.fromkeys([learner.node for learner in learners]))
        if job.order is None:
            job.order = self._claims
            self._claims += 1
        run_s = job.attempts[0].run_s
        job.run_start = now
        job.run_end = math.inf if run_s is None else now + run_s
        job.token += 1
        if run_s is not None:
            self._schedule(job.run_end + self._delay, RELEASE, job)

    def _release(self, now: float, job: _Job) -> None:
        """The attempt's GPUs go back: the job ends, or waits for its next attempt."""
        self._give_back(job)
        attempt = job.attempts.pop(0)
        if not job.attempts:
            job.end = job.run_end
            return
        back = job.run_end + attempt.backoff_s
        if back <= now:
            self._enqueue(job)
        else:
            self._schedule(back, REQUEUE, job)

    def _stop(self, now: float, job: _Job) -> None:
        """Cancelled (or the log ends): out of the queue, or its attempt ends now and the job
        once its GPUs are back."""
        if job.end is not None:
            return
        job.token += 1
        if job.nodes:
            job.run_end = now
            del job.attempts[1:]
            self._schedule(now + self._delay, RELEASE, job)
            return
        if job.queued:
            job.queued = False
            self._queue.remove(job.index)
        job.end = now

    def _restart(self, now: float, job: _Job) -> None:
        """Its node left: the attempt ends now, and the job queues again for the rest of it."""
        if job.run_end <= now:
            return  # it had ended; its GPUs were about to go back anyway
        current = job.attempts[0]
        rest = None if current.run_s is None else job.run_end - now
        job.token += 1
        job.run_end = now
        self._give_back(job)
        job.attempts[0] = replace(current, run_s=rest)
        self._enqueue(job)

    def _give_back(self, job: _Job) -> None:
        queued = job.spec.queued
        self._cluster.release(job.index, job.nodes)
        self._held[queued.tenant] -= job.gpus
        job.runs.append(Run(job.run_start, job.run_end))
        job.nodes = []

    def _outcome(self, job: _Job) -> Outcome:
        queued = job.spec.queued
        return Outcome(
            job_id=queued.job_id,
            tenant=queued.tenant,
            gpus=job.gpus,
            submitted=job.spec.submitted,
            runs=tuple(job.runs),
            end=job.end,
            order=job.order,
        )
