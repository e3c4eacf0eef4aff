"""The agent port's in-memory twin: the control plane's side of an agent's life kept in dicts,
for agent tests and simulations that need no database. It passes the contract suite that
`PostgresPort` passes (tests/controlplane/agent_port): leases held by one live agent, jobs
driven by the pure lifecycle (`controlplane.jobs.lifecycle.decide`/`evolve`), claims placed
and ordered as the claim's SQL does (`scheduling.claim_order`, `scheduling.placement`, under the
policy in force: `set_policy`), each
with a fencing epoch that only grows, no GPU or job claimed twice, log lines deduplicated by
(series, seq), uids held per job or warm placeholder, serving tasks and inference queries fenced
by their claim tokens and their tries counted.

What only the control plane's other parts do here is done by the methods below the port's
(`submit`, `expire_folders`, `release_uids`, `queue_task`, ...): the twin's stand-ins for
the HTTP API and the lifecycle manager, which tests call as those would act.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID, uuid4

from controlplane.agent_port.values import (
    Allocation,
    ClaimedTask,
    ExpiredFolders,
    InferenceJob,
    JobNews,
    QueryClaim,
    TaskResults,
    WarmUid,
)
from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import NodeAddress, NodeNameTaken, NodeSpec, Renewal
from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.deployments.tasks import MAX_TRIES as MAX_TASK_TRIES
from controlplane.inference.progress import MAX_TRIES as MAX_QUERY_TRIES
from controlplane.jobs.events import JobEvent
from controlplane.jobs.lifecycle import (
    Command,
    Deploy,
    Job,
    JobStatus,
    Refused,
    Submit,
    decide,
    evolve,
)
from controlplane.jobs.limits import JobLimits
from controlplane.jobs.manifest import JobManifest
from controlplane.logs.lines import LogLine, Series, Stream
from controlplane.scheduling.claim import Claim
from controlplane.scheduling.claim_order import CLAIM_BATCH, QueuedJob, TenantShare, claim_order
from controlplane.scheduling.placement import Capacity, place
from controlplane.scheduling.policy import DEFAULT, ClaimPolicy
from controlplane.scheduling.unschedulable import demand_of


@dataclass
class _Node:
    agent_id: UUID
    ready: bool
    lease_until: datetime
    cpus: float
    memory_mb: int
    gpus: list[GpuInfo]
    draining: bool = False
    address: str | None = None
    job_plan: str | None = None


@dataclass
class _Held:
    """One learner's live allocation."""

    allocation: Allocation
    tenant: str
    cpus: float
    memory_mb: int


@dataclass
class _Task:
    task_id: UUID
    tenant: str
    deployment: str
    items: int
    input: str
    submitted_at: datetime
    state: str = "queued"
    claim: UUID | None = None
    replica: UUID | None = None
    tries: int = 0
    output: str | None = None
    error: str | None = None


@dataclass
class _Query:
    state: str
    claim: UUID | None
    replica: UUID | None
    tries: int
    output: str | None = None
    error: str | None = None
    finished: bool = False


@dataclass
class _InferenceJob:
    row: InferenceJob
    weight: float
    queries: int | None
    started: int = 0
    vtime: float = 0.0
    done: bool = False
    load_error: str | None = None
    seen: dict[UUID, datetime] = field(default_factory=dict)
    """When each replica last asked (or said it is present)."""
    runs: dict[int, _Query] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Folders:
    uid: int | None
    checkpoints: UUID


class MemoryPort:
    """The whole control plane an agent sees, in one process's memory."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._nodes: dict[str, _Node] = {}
        self._streams: dict[UUID, list[JobEvent]] = {}
        self._secrets: dict[UUID, dict[str, str]] = {}
        self._policy = DEFAULT
        """The claim policy in force, as the `scheduling_policy` row is for the claim's SQL."""
        self._weights: dict[str, float] = {}
        self._quotas: dict[str, int | None] = {}
        self._epoch = 0
        self._held: dict[tuple[UUID, int, int], _Held] = {}
        self._lines: dict[Series, dict[int, LogLine]] = {}
        self._last_id: defaultdict[UUID, int] = defaultdict(int)
        self._stored: defaultdict[UUID, list[LogLine]] = defaultdict(list)
        """Each job's lines in the order they were stored (the order of their ids)."""
        self._uids: dict[UUID, int] = {}
        """Each holder's uid: jobs, and warm placeholders (as learner_uids holds both)."""
        self._warm: dict[UUID, str] = {}
        """Each warm placeholder's node."""
        self._adopted: set[UUID] = set()
        """Jobs whose uid was a warm sandbox's: no later adoption gives it back."""
        self._used: set[UUID] = set()
        """Jobs some node recorded folders of (learner_uids.used): their uid is never given back
        by an adoption, forgotten folders or not."""
        self._folders: dict[tuple[UUID, str], _Folders] = {}
        self._expired: set[UUID] = set()
        self._tasks: dict[UUID, _Task] = {}
        self._inference: dict[UUID, _InferenceJob] = {}
        self.channels: dict[UUID, tuple[str, str, str, str, str]] = {}
        """Replicas offered on their agents' serving channels: tenant, deployment, node,
        address, token."""

    # Lease

    async def register(self, node: NodeSpec, ttl_s: float) -> datetime:
        now = self._clock.now()
        held = self._nodes.get(node.name)
        if (
            held is not None
            and held.ready
            and held.lease_until >= now
            and held.agent_id != node.agent_id
        ):
            raise NodeNameTaken(
                f"node name {node.name!r} is held by a live agent ({held.agent_id}, lease until "
                f"{held.lease_until:%Y-%m-%d %H:%M:%S%z}); stop that agent or choose another --name"
            )
        lease = now + timedelta(seconds=ttl_s)
        self._nodes[node.name] = _Node(
            node.agent_id,
            True,
            lease,
            node.cpus,
            node.memory_mb,
            list(node.gpus),
            draining=held is not None and held.draining,  # the operator's, kept
            address=node.address,
            job_plan=node.job_plan,
        )
        return lease

    async def renew(self, name: str, agent_id: UUID, ttl_s: float) -> Renewal | None:
        held = self._nodes.get(name)
        if held is None or held.agent_id != agent_id or not held.ready:
            return None
        held.lease_until = self._clock.now() + timedelta(seconds=ttl_s)
        return Renewal(held.lease_until, held.draining)

    async def mark_unhealthy(self, name: str, gpu: GpuInfo) -> None:
        held = self._nodes.get(name)
        if held is None:
            return
        reason = gpu.health_reason or "unhealthy"
        held.gpus = [
            g.model_copy(update={"healthy": False, "health_reason": reason})
            if g.uuid == gpu.uuid
            else g
            for g in held.gpus
        ]

    async def node_addresses(self, names: Sequence[str]) -> dict[str, NodeAddress]:
        return {
            name: NodeAddress(node.address, node.job_plan)
            for name in names
            if (node := self._nodes.get(name)) is not None and node.address is not None
        }

    async def deregister(self, name: str, agent_id: UUID) -> None:
        held = self._nodes.get(name)
        if held is not None and held.agent_id == agent_id:
            held.ready = False
            held.lease_until = self._clock.now()

    # Job claims

    async def claim(self, node: str, *, uids: range | None) -> list[Claim]:
        now = self._clock.now()
        ready = self._capacities()
        queue = [
            QueuedJob(
                job.job_id,
                job.tenant,
                demand_of(job.manifest),
                job.manifest.priority,
                job.submitted_at,
                job.not_before,
            )
            for job in self._jobs()
            if job.state is JobStatus.QUEUED
            and job.manifest.inference is None  # no node: replicas run it
        ]
        held_gpus: defaultdict[str, int] = defaultdict(int)
        for held in self._held.values():
            held_gpus[held.tenant] += len(held.allocation.gpus)
        tenants = [
            TenantShare(name, self._weights[name], self._quotas[name], held_gpus[name])
            for name in sorted(self._weights)
        ]
        ordered = claim_order(
            node, ready, tenants, queue, limit=CLAIM_BATCH, now=now, policy=self._policy
        )
        room = next((r for r in ready if r.node == node), None)
        won: list[Claim] = []
        for queued in ordered:
            if room is None:
                break
            learners = place(queued.demand, [room])
            if learners is None and won:
                continue
            if learners is None:
                others = [r for r in ready if r.node != node]
                others.sort(key=lambda r: (-len(r.gpus), r.node))
                learners = place(queued.demand, [room, *others])
                if learners is None:
                    continue
            if uids is not None and await self.allocate_uid(queued.job_id, uids) is None:
                continue  # it waits in the queue until a uid is free
            self._epoch += 1
            job_id = queued.job_id
            nodes = list(dict.fromkeys(learner.node for learner in learners))
            gpus = [gpu for learner in learners for gpu in learner.gpus]
            deploy = Deploy(
                nodes=nodes,
                gpus=gpus,
                epoch=self._epoch,
                at=now,
                learner_nodes=[learner.node for learner in learners],
            )
            job = self._append(job_id, deploy)
            version = len(self._streams[job_id])
            for learner in learners:
                allocation = Allocation(
                    job_id, job.attempt, learner.index, learner.node, self._epoch, learner.gpus
                )
                self._held[(job_id, job.attempt, learner.index)] = _Held(
                    allocation, job.tenant, queued.demand.cpus, queued.demand.memory_mb
                )
            won.append(Claim(job, job.attempt, self._epoch, learners, version))
            if any(learner.node != node for learner in learners):
                break
            room = room.less(learners, queued.demand)
        return won

    async def release(self, node: str, job_id: UUID, attempt: int) -> None:
        for key, held in list(self._held.items()):
            if key[:2] == (job_id, attempt) and held.allocation.node == node:
                del self._held[key]

    async def allocations(self, node: str) -> list[Allocation]:
        held = [h.allocation for h in self._held.values() if h.allocation.node == node]
        return sorted(held, key=lambda a: (a.job_id, a.attempt, a.learner))

    # Job commands

    async def current(self, job_id: UUID) -> tuple[Job | None, int]:
        return self._job(job_id), len(self._streams.get(job_id, []))

    async def execute(self, job_id: UUID, command: Command, actor: str) -> Job:
        job = self._job(job_id)
        if job is None:
            raise Refused("no such job", not_found=True)
        return self._append(job_id, command)

    async def news(self, job_id: UUID, after: int) -> list[JobNews]:
        stream = self._streams.get(job_id, [])
        return [JobNews(v, e) for v, e in enumerate(stream, start=1) if v > after]

    async def secret_env(self, job_id: UUID) -> dict[str, str]:
        return dict(self._secrets.get(job_id, {}))

    # Logs

    async def write_lines(self, lines: Sequence[LogLine]) -> int:
        last: dict[Series, int] = {}
        for line in lines:
            if line.seq <= last.get(line.series, 0):
                raise ValueError(
                    f"seq of {line.stream} of job {line.job_id} attempt {line.attempt} learner "
                    f"{line.learner} goes from {last[line.series]} to {line.seq} in one batch: "
                    "it must increase"
                )
            last[line.series] = line.seq
        for line in lines:
            # Ids are reserved for every line sent, stored or not, as `reserve_log_ids` does:
            # the job's line count is its last id (`job_log_usage`).
            self._last_id[line.job_id] += 1
        stored = 0
        for line in lines:
            series = self._lines.setdefault(line.series, {})
            # At or below the series' stored seq: stored already (an earlier try of the batch).
            if line.seq <= max(series, default=0):
                continue
            series[line.seq] = line
            self._stored[line.job_id].append(line)
            stored += 1
        return stored

    async def log_usage(self, job_id: UUID) -> tuple[int, int]:
        size = sum(
            len(line.text.encode("utf-8"))
            for series, lines in self._lines.items()
            if series[0] == job_id
            for line in lines.values()
        )
        return self._last_id[job_id], size

    async def last_seqs(self, job_id: UUID, attempt: int) -> dict[tuple[int, Stream], int]:
        return {
            (learner, stream): max(lines)
            for (job, number, learner, stream), lines in self._lines.items()
            if job == job_id and number == attempt and lines
        }

    # Folders and uids

    async def record_folders(
        self, job_id: UUID, node: str, uid: int | None, checkpoints: UUID
    ) -> None:
        self._folders.setdefault((job_id, node), _Folders(uid, checkpoints))
        self._used.add(job_id)  # files may be owned by its uid, forgotten folders or not

    async def expired_folders(self, node: str) -> list[ExpiredFolders]:
        used = {
            folders.checkpoints
            for (job_id, _), folders in self._folders.items()
            if job_id not in self._expired
        }
        return [
            ExpiredFolders(job_id, folders.uid, folders.checkpoints, folders.checkpoints in used)
            for (job_id, at), folders in sorted(self._folders.items(), key=lambda kv: kv[0][0])
            if at == node and job_id in self._expired
        ]

    async def forget_folders(self, job_id: UUID, node: str) -> None:
        self._folders.pop((job_id, node), None)

    async def allocate_uid(self, job_id: UUID, uids: range) -> int | None:
        if job_id in self._uids:
            return self._uids[job_id]
        taken = set(self._uids.values())
        free = next((uid for uid in uids if uid not in taken), None)
        if free is not None:
            self._uids[job_id] = free
        return free

    async def hold_warm_uid(self, node: str, uids: range) -> WarmUid | None:
        placeholder = uuid4()
        uid = await self.allocate_uid(placeholder, uids)
        if uid is None:
            return None
        self._warm[placeholder] = node
        return WarmUid(placeholder, uid)

    async def adopt_warm_uid(
        self, job_id: UUID, node: str, placeholder: UUID, checkpoints: UUID
    ) -> int | None:
        live = {h.allocation.node for h in self._held.values() if h.allocation.job_id == job_id}
        if (
            self._warm.get(placeholder) != node
            or any(folders_of == job_id for folders_of, _ in self._folders)
            or live != {node}
            or job_id in self._adopted
            or job_id in self._used
        ):
            return None
        uid = self._uids.pop(placeholder)
        self._uids[job_id] = uid  # the claim's uid, if any, is free again
        del self._warm[placeholder]
        self._adopted.add(job_id)
        await self.record_folders(job_id, node, uid, checkpoints)
        return uid

    async def release_warm_uids(self, node: str, placeholders: Sequence[UUID] | None = None) -> int:
        gone = [
            placeholder
            for placeholder, at in self._warm.items()
            if at == node and (placeholders is None or placeholder in placeholders)
        ]
        for placeholder in gone:
            del self._warm[placeholder]
            del self._uids[placeholder]
        return len(gone)

    # Serving

    async def claim_tasks(
        self,
        tenant: str,
        deployment: str,
        most_items: int,
        claim: UUID,
        replica: UUID,
        known: Sequence[UUID],
    ) -> list[ClaimedTask]:
        mine = [
            t for t in self._tasks.values() if t.tenant == tenant and t.deployment == deployment
        ]
        held = [
            t
            for t in mine
            if t.state == "running"
            and t.claim == claim
            and t.replica == replica
            and t.task_id not in known
        ]
        if not held:
            queued = sorted(
                (t for t in mine if t.state == "queued"),
                key=lambda t: (t.submitted_at, t.task_id),
            )[:most_items]
            items = 0
            retried = False
            for n, task in enumerate(queued):
                items += task.items
                retried = retried or task.tries > 0
                # The first always; then while they fit and none before was tried already (a
                # task tried before runs alone).
                if n > 0 and (items > most_items or retried):
                    break
                task.state, task.claim, task.replica = "running", claim, replica
                task.tries += 1
                held.append(task)
        now = self._clock.now()
        return [
            ClaimedTask(t.task_id, t.items, t.input, (now - t.submitted_at).total_seconds() * 1000)
            for t in held
        ]

    async def finish_tasks(self, results: TaskResults) -> int:
        recorded = 0
        done = zip(results.task_ids, results.outputs, results.errors, strict=True)
        for task_id, output, error in done:
            task = self._tasks.get(task_id)
            if task is None or task.state != "running" or task.claim != results.claim:
                continue  # given back meanwhile: another try runs it
            task.state = "failed" if error is not None else "succeeded"
            task.output, task.error, task.claim = output, error, None
            recorded += 1
        return recorded

    async def offer_channel(
        self, replica: UUID, tenant: str, deployment: str, node: str, address: str, token: str
    ) -> None:
        self.channels[replica] = (tenant, deployment, node, address, token)

    async def withdraw_channel(self, replica: UUID) -> None:
        self.channels.pop(replica, None)

    async def requeue_replica(self, replica: UUID) -> None:
        for task in self._tasks.values():
            if task.replica == replica and task.state == "running":
                task.claim = None
                if task.tries >= MAX_TASK_TRIES:
                    task.state = "failed"
                    task.error = f"its replica was lost while running it, {task.tries} times"
                else:
                    task.state = "queued"
        for job in self._inference.values():
            for query in job.runs.values():
                if query.replica == replica and query.state == "running":
                    query.claim = None
                    if query.tries >= MAX_QUERY_TRIES:
                        query.state, query.finished = "failed", True
                        query.error = f"its replica was lost while running it, {query.tries} times"
                    else:
                        query.state = "queued"

    async def inference_job(self, job_id: UUID) -> InferenceJob | None:
        job = self._inference.get(job_id)
        return None if job is None else job.row

    async def claim_query(
        self, job_id: UUID, replica: UUID, claim: UUID, node: str, present_s: float
    ) -> QueryClaim:
        job = self._inference.get(job_id)
        if job is None:
            return QueryClaim(None, "wait")
        now = self._clock.now()
        present = timedelta(seconds=present_s)
        before = max(job.seen.values(), default=None)
        job.seen[replica] = now
        held = [
            i
            for i, q in job.runs.items()
            if q.state == "running" and q.claim == claim and q.replica == replica
        ]
        if held:
            return QueryClaim(held[0], "claimed")
        if job.done:
            return QueryClaim(None, "done")
        given_back = sorted(i for i, q in job.runs.items() if q.state == "queued")
        if given_back:
            query = job.runs[given_back[0]]
            query.state, query.claim, query.replica = "running", claim, replica
            query.tries += 1
            return QueryClaim(given_back[0], "claimed")
        others = [
            o.vtime
            for other_id, o in self._inference.items()
            if other_id != job_id
            and not o.done
            and any(seen > now - present for seen in o.seen.values())
        ]
        floor = min(others, default=None)
        vtime = job.vtime
        if before is None or before <= now - present:
            # Joining (or back after a pause) at the least of the others: no burst, no wait.
            vtime = max(job.vtime, job.vtime if floor is None else floor)
        more = job.queries is None or job.started < job.queries
        if more and (floor is None or vtime <= floor):
            index = job.started
            job.started += 1
            job.vtime = vtime + 1 / job.weight
            job.runs[index] = _Query("running", claim, replica, tries=1)
            return QueryClaim(index, "claimed")
        unfinished = any(not q.finished for q in job.runs.values())
        if not more and not unfinished:
            return QueryClaim(None, "done")
        return QueryClaim(None, "wait")

    async def finish_query(
        self,
        job_id: UUID,
        index: int,
        output: str | None,
        error: str | None,
        inference_ms: float | None,
        claim: UUID,
    ) -> int:
        job = self._inference.get(job_id)
        query = None if job is None else job.runs.get(index)
        if query is None or query.state != "running" or query.claim != claim:
            return 0
        query.state = "succeeded" if error is None else "failed"
        query.output, query.error, query.claim, query.finished = output, error, None, True
        return 1

    async def replica_present(self, job_id: UUID, replica: UUID) -> None:
        job = self._inference.get(job_id)
        if job is not None and replica in job.seen:
            job.seen[replica] = self._clock.now()

    async def record_load_error(self, job_id: UUID, error: str) -> None:
        job = self._inference.get(job_id)
        if job is not None and job.load_error is None:
            job.load_error = error

    # The control plane's other parts, as tests drive them

    def tenant(self, name: str, weight: float = 1.0, gpu_quota: int | None = None) -> None:
        self._weights[name] = weight
        self._quotas[name] = gpu_quota

    def set_policy(self, policy: ClaimPolicy) -> None:
        """The admin switches the claim policy (`trainyard scheduling set-policy`)."""
        self._policy = policy

    def submit(
        self,
        tenant: str,
        manifest: JobManifest,
        *,
        limits: JobLimits | None = None,
        secret_env: dict[str, str] | None = None,
    ) -> UUID:
        """A job submitted by `tenant` (created with weight 1 if unknown): QUEUED."""
        if tenant not in self._weights:
            self.tenant(tenant)
        job_id = uuid4()
        self._streams[job_id] = []
        submit = Submit(job_id, tenant, manifest, self._clock.now(), limits or JobLimits())
        self._append(job_id, submit)
        if secret_env:
            self._secrets[job_id] = dict(secret_env)
        return job_id

    def job(self, job_id: UUID) -> Job | None:
        return self._job(job_id)

    def lines(self, job_id: UUID) -> list[LogLine]:
        """The job's stored lines, in the order they were stored."""
        return list(self._stored[job_id])

    def lose(self, node: str) -> None:
        """The lifecycle manager declared the node lost: its lease is no one's."""
        held = self._nodes.get(node)
        if held is not None:
            held.ready = False

    def drain(self, node: str, draining: bool = True) -> None:
        """An operator drained the node (or, `draining` false, put it back in service)."""
        self._nodes[node].draining = draining

    def expire_folders(self, job_id: UUID) -> None:
        """The job's retention ended: every node removes its folders."""
        self._expired.add(job_id)

    def release_uids(self) -> int:
        """The lifecycle manager's sweep past the retention (`release_learner_uids`): the uids of
        jobs that ended and whose folders no node records go back (never a warm placeholder's:
        it is no job's); how many."""
        kept = {job_id for job_id, _ in self._folders}
        gone = [
            job_id
            for job_id in self._uids
            if job_id not in kept and (job := self._job(job_id)) is not None and job.state.terminal
        ]
        for job_id in gone:
            del self._uids[job_id]
            self._adopted.discard(job_id)
        return len(gone)

    def queue_task(self, tenant: str, deployment: str, inputs: list[object]) -> UUID:
        task_id = uuid4()
        self._tasks[task_id] = _Task(
            task_id, tenant, deployment, len(inputs), json.dumps(inputs), self._clock.now()
        )
        return task_id

    def task(self, task_id: UUID) -> tuple[str, str | None, str | None, int]:
        """A task's state, output, error and tries."""
        task = self._tasks[task_id]
        return task.state, task.output, task.error, task.tries

    def start_inference(
        self,
        job_id: UUID,
        source: dict[str, object],
        batch_size: int,
        *,
        weight: float = 1.0,
        queries: int | None = None,
    ) -> None:
        """An inference job's row, as its service writes it."""
        row = InferenceJob(json.dumps(source), batch_size)
        self._inference[job_id] = _InferenceJob(row, weight, queries)

    def load_error(self, job_id: UUID) -> str | None:
        return self._inference[job_id].load_error

    # The state behind it

    def _job(self, job_id: UUID) -> Job | None:
        job: Job | None = None
        for event in self._streams.get(job_id, []):
            job = evolve(job, event)
        return job

    def _jobs(self) -> list[Job]:
        return [job for job_id in self._streams if (job := self._job(job_id)) is not None]

    def _append(self, job_id: UUID, command: Command) -> Job:
        """Decide and append, as the event store's commands do (Refused writes nothing)."""
        job = self._job(job_id)
        events = decide(command, job)
        self._streams.setdefault(job_id, []).extend(events)
        for event in events:
            job = evolve(job, event)
        if job is None:
            raise Refused("no such job", not_found=True)
        return job

    def _capacities(self) -> list[Capacity]:
        """What every READY node not draining can still give, as the node_capacity view counts
        it."""
        allocated = {gpu for held in self._held.values() for gpu in held.allocation.gpus}
        rooms = []
        for name, node in self._nodes.items():
            if not node.ready or node.draining:
                continue  # a lease that ran out counts until the node is declared lost
            here = [h for h in self._held.values() if h.allocation.node == name]
            rooms.append(
                Capacity(
                    name,
                    [g.uuid for g in node.gpus if g.healthy and g.uuid not in allocated],
                    node.cpus - sum(h.cpus for h in here),
                    node.memory_mb - sum(h.memory_mb for h in here),
                )
            )
        return rooms
