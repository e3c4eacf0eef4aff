"""The node agent: registers its node, renews its lease, claims work that fits, runs it, and
carries cancel and checkpoint requests to its learners."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar
from uuid import UUID

from controlplane.agent_port.protocol import AgentPort
from controlplane.agent_port.support import GPU_UTILIZATION, Reading
from controlplane.agent_port.vocabulary import (
    DEFAULT_ALLOWLIST,
    SYSTEM_CLOCK,
    UNAVAILABLE,
    CheckpointRequested,
    Claim,
    Clock,
    DeploymentRolledBack,
    GpuInfo,
    ImageAllowlist,
    JobCancelled,
    JobFailed,
    JobRestarted,
    NodeSpec,
    Roots,
    ServableSpec,
    Stream,
)
from controlplane.agent_port.wakes import CLAIMABLE_CHANNEL, REQUESTS_CHANNEL, LogListener
from controlplane.jobs.lifecycle import Command, Job, Refused, RollBack
from node_agent.attempt import Attempt, LogSink, drained
from node_agent.folders import JobFolders
from node_agent.inventory import Gpu, GpuInventory
from node_agent.job_links import (
    DEFAULT_RANGE,
    AddressPlan,
    JobLink,
    LinkError,
    job_link,
    unlinked_because,
)
from node_agent.learners import checkpoints_of, learner_specs
from node_agent.process_runtime import ProcessRuntime
from node_agent.reconcile import Resumed, VersionedJob, plan
from node_agent.runtime import FoundLearner, Learner, LearnerRuntime, LearnerSpec
from node_agent.serving import Serving
from node_agent.serving_channel import DEFAULT_LISTEN
from node_agent.users import DEFAULT_LEARNER_UIDS, NoUid, UidRange, Users
from node_agent.wakes import Heard, Round, gpu_free, round_after
from node_agent.warm import WarmSandbox
from node_agent.warm_pool import WarmPool
from runners.config import SERVE_DIR

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_MIN_S = 0.2
RETRY_MAX_S = 10.0


@dataclass(frozen=True, slots=True)
class AgentConfig:
    name: str
    work_dir: Path
    cpus: float
    memory_mb: int
    launcher: tuple[str, ...]
    """How a learner's command is wrapped: the launcher, then `--`, then the user's command."""
    heartbeat_s: float = 2.0
    ttl_s: float = 10.0
    grace_s: float = 10.0
    poll_s: float = 1.0
    listen: bool = True
    """Whether the agent holds a LISTEN connection for its wake-up hints (claimable jobs,
    requests, its replicas' tasks); without one it does each every `poll_s`, and a fleet of
    such agents behind pgBouncer needs no server connection each (docs/operations.md,
    "Connection budget")."""
    runtime: str = "process"
    """How learners run: "process" (child processes) or "docker" (containers)."""
    request_gpus: bool = True
    """Whether a container's GPUs are requested from the engine's NVIDIA driver: not for fake
    GPUs, which an engine can only take with a stand-in driver (as under CI)."""
    network_tenants: frozenset[str] = frozenset()
    """Tenants whose learners may use the network; the others' containers have none."""
    images: ImageAllowlist = DEFAULT_ALLOWLIST
    """The learner images containers may be created from (`TRAINYARD_IMAGES`)."""
    checkpoint_dir: Path | None = None
    """Where jobs' checkpoints go, per job and learner; None: under `work_dir`. A directory that
    every node mounts (NFS, say) lets a job restarted on another node, after its node was lost,
    resume from its checkpoint; under `work_dir` it resumes only on this node."""
    roots: Roots = field(default_factory=Roots)
    """Where jobs' `file://` data and results may be (see `controlplane.jobs.locations`)."""
    learner_uids: UidRange = field(default_factory=lambda: UidRange.parse(DEFAULT_LEARNER_UIDS))
    """The uids jobs' learners run as, one per job, when the agent is root."""
    node_address: str | None = None
    """The node's IPv4 address on the cluster network, recorded with its registration: where the
    other nodes route the addresses of jobs whose learners span this node
    (`node_agent.job_links`); None: such jobs get no network across nodes."""
    job_network: AddressPlan = field(default_factory=lambda: AddressPlan.parse(DEFAULT_RANGE))
    """The cluster's range of jobs' addresses, the same on every node."""
    artifacts_dir: Path | None = None
    """The model repository's artifacts (the control plane's TRAINYARD_ARTIFACTS_DIR, shared
    with this node): what deployments' replicas load. None: replicas fail their tasks."""
    folder_sweep_s: float = 60.0
    """How often the folders of jobs whose retention ended are looked for and removed: they
    go days after their job, so a minute late costs nothing."""
    serving_listen: str | None = DEFAULT_LISTEN
    """Where the serving channel listens (HOST:PORT), the control plane's direct path to this
    node's replicas (node_agent/serving_channel.py); None: no channel, predictions queue."""
    warm: int = 0
    """How many warm sandboxes the agent keeps ready (`node_agent.warm_pool`; an agent that is
    root, process runtime): a learner that can start in one skips its sandbox's making, its
    interpreter's start and the imports of `warm_imports`."""
    warm_imports: tuple[str, ...] = ()
    """What a warm sandbox imports ahead, besides the launcher (`torch`, say)."""

    @property
    def checkpoint_root(self) -> Path:
        return self.checkpoint_dir or self.work_dir


@dataclass
class _Running:
    attempt: Attempt
    version: int
    """The job stream's version this agent has looked at (for cancel and checkpoint requests)."""


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        port: AgentPort,
        listener: LogListener,
        inventory: GpuInventory,
        runtime: LearnerRuntime,
        logs: LogSink,
        agent_id: UUID,
        *,
        serving: Serving | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self._serving = serving
        """Feeds deployments' replicas with tasks; None: replicas are not fed here."""
        self.agent_id = agent_id
        """Kept across restarts (see `node_agent.identity`)."""
        self._port = port
        self._clock = clock
        self._listener = listener
        """Notified on CLAIMABLE_CHANNEL and REQUESTS_CHANNEL (see `node_agent.wakes`)."""
        self._inventory = inventory
        self._runtime = runtime
        self._logs = logs
        self._running: dict[UUID, _Running] = {}
        self._attempts: asyncio.TaskGroup | None = None
        """Where attempts run, while `run()` runs; those `reconcile()` resumes wait for it."""
        self._users = Users(port, config.learner_uids, root=os.geteuid() == 0)
        self._warm: WarmPool | None = None
        """Sandboxes kept ready for claims (`config.warm`), where learners run sandboxed."""
        if config.warm > 0 and isinstance(runtime, ProcessRuntime) and runtime.warm is not None:
            self._warm = WarmPool(runtime.warm, self._users, config.name, config.warm)
        self._folders = JobFolders(port, config.name, config.work_dir, config.checkpoint_root)
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()
        self._gpus: list[str] = []
        """The node's GPUs, as registered: whether one is free is then known at each wake
        without asking NVML or the database (`_gpu_free`)."""
        self._unhealthy: set[str] = set()
        self.fenced = False
        """Whether the node lost its lease (declared LOST): its learners were killed."""
        self.draining = False
        """Whether an operator drained the node, as its lease's last renewal said: it claims
        nothing, and what it runs is preempted."""

    def stop(self) -> None:
        """Stop claiming; learners are stopped (they checkpoint) and their jobs re-queued."""
        self._stopping.set()
        self._changed.set()

    async def register(self) -> None:
        """Take the node's lease; NodeNameTaken when another live agent holds the name."""
        gpus = [_info(gpu) for gpu in self._inventory.gpus()]
        self._gpus = [g.uuid for g in gpus]
        self._unhealthy = {g.uuid for g in gpus if not g.healthy}
        spec = NodeSpec(
            name=self.config.name,
            agent_id=self.agent_id,
            runtime=self._runtime.name,
            cpus=self.config.cpus,
            memory_mb=self.config.memory_mb,
            gpus=gpus,
            address=self.config.node_address,
            job_plan=self.config.job_network.key(self.config.learner_uids.start),
        )
        await self._port.register(spec, self.config.ttl_s)
        log.info("node %s registered with %d GPU(s)", self.config.name, len(gpus))

    async def reconcile(self) -> None:
        """Take over what an earlier agent of this node left: re-adopt the learners of attempts
        that still run here, release the allocations of those that are over, and kill stale
        learners (see `node_agent.reconcile`). Call after `register()`, before `run()`."""
        await self._account(await self._runtime.find(self.config.name))
        # The warm sandboxes an earlier agent left are gone (`find` removed them): their uids
        # go back, whether this agent keeps any.
        await self._users.release_warm(self.config.name, None)

    async def _account(self, found: list[FoundLearner]) -> None:
        """Act on `plan` for this node's allocations that no attempt here runs: after a
        restart, all of them; later, learners that another node's claim placed here (a job on
        several nodes), and allocations whose attempt ended without this node."""
        allocations = [
            held
            for held in await self._port.allocations(self.config.name)
            if held.job_id not in self._running
        ]
        if not allocations and not found:
            return
        jobs: dict[UUID, VersionedJob] = {}
        for job_id in {a.job_id for a in allocations}:
            job, version = await self._port.current(job_id)
            if job is not None:
                jobs[job_id] = VersionedJob(job, version)
        todo = plan(allocations, jobs, found)
        # Stale learners die before anything is released or resumed: their GPUs are about
        # to be someone else's.
        for stale in todo.kill:
            log.warning(
                "job %s attempt %d learner %d: stale (epoch %d), killing it",
                stale.job_id,
                stale.attempt,
                stale.learner,
                stale.epoch,
            )
            await self._runtime.kill(stale)
        for job_id, attempt in todo.release:
            await self._port.release(self.config.name, job_id, attempt)
        for resumed in todo.resume:
            await self._resume(resumed)

    async def _resume(self, resumed: Resumed) -> None:
        won = resumed.claim
        stored = await self._port.last_seqs(won.job.job_id, won.attempt)
        adopted: dict[int, Learner] = {}
        specs = await self._prepare(won)
        if specs is None:
            return
        for spec in specs:
            for stream in ("stdout", "stderr"):
                self._logs.resume(spec, stream, stored.get((spec.learner, Stream(stream)), 0))
            learner = await self._runtime.adopt(spec, resumed.running.get(spec.learner))
            if learner is not None:
                adopted[spec.learner] = learner
        log.info(
            "job %s attempt %d: %d learner(s) here, %d of them started by an earlier agent",
            won.job.job_id,
            won.attempt,
            len(won.on(self.config.name)),
            len(adopted),
        )
        self._start(won, specs, adopted)

    async def run(self) -> None:
        """Heartbeats and work until `stop()`; then stop the attempts (their learners stop,
        their jobs go back to the queue), wait for them, and deregister. A cancellation stops
        it in the same order before it goes on (a second one cuts the wait short). Call
        `register()` first."""
        cancelled: asyncio.CancelledError | None = None
        try:
            with GPU_UTILIZATION.source(self._gpu_utilization):
                async with asyncio.TaskGroup() as group:
                    heartbeats = group.create_task(self._heartbeats(), name="heartbeats")
                    folders = group.create_task(self._sweep_folders(), name="folders")
                    warm = None
                    if self._warm is not None:
                        warm = group.create_task(self._warm.run(), name="warm-sandboxes")
                    # Ends once every attempt has, while the heartbeats keep the lease.
                    async with asyncio.TaskGroup() as attempts:
                        self._attempts = attempts
                        for running in self._running.values():
                            self._launch(attempts, running.attempt)  # resumed by `reconcile()`
                        try:
                            await self._work()
                        except asyncio.CancelledError as exc:
                            # Not raised here: the group would cut the attempts short, and
                            # their jobs would stay on this node, not go back to the queue.
                            log.info("node agent cancelled: stopping its attempts first")
                            cancelled = exc
                            self.stop()
                        self._stop_attempts()
                    heartbeats.cancel()
                    folders.cancel()
                    if warm is not None:
                        warm.cancel()
        finally:
            self._attempts = None
            # Shielded: a cancelled shutdown must still give the node's name back.
            with contextlib.suppress(*UNAVAILABLE):
                await asyncio.shield(self._port.deregister(self.config.name, self.agent_id))
        if cancelled is not None:
            raise cancelled

    def _gpu_utilization(self) -> list[Reading]:
        """NVML's utilization of each GPU of each running attempt, labelled with its job (run
        by a metrics collection, on any thread)."""
        attempts = [running.attempt.claim for running in list(self._running.values())]
        if not attempts:
            return []
        percent = self._inventory.utilization()
        return [
            (
                percent[gpu],
                {
                    "job": str(claim.job.job_id),
                    "attempt": claim.attempt,
                    "learner": learner.index,
                    "node": self.config.name,
                    "gpu": gpu,
                },
            )
            for claim in attempts
            for learner in claim.learners
            for gpu in learner.gpus
            if gpu in percent
        ]

    async def _heartbeats(self) -> None:
        while True:
            try:
                renewal = await self._port.renew(self.config.name, self.agent_id, self.config.ttl_s)
                if renewal is None:
                    # The node was declared LOST and its jobs restarted elsewhere: its learners
                    # are stale (fenced) and must die without reporting anything.
                    log.error("node %s: lease lost; killing stale learners", self.config.name)
                    self.fenced = True
                    self.stop()
                    return
                self._drain(renewal.draining)
                await self._check_gpus()
            except UNAVAILABLE as exc:
                # Learners keep running; the lease survives hiccups shorter than its TTL.
                log.warning("heartbeat failed (%s); retrying", exc)
            await asyncio.sleep(self.config.heartbeat_s)

    def _drain(self, draining: bool) -> None:
        """Follow the operator's drain: while the node is draining, preempt every attempt it
        runs (those claimed or adopted since the last renewal too) as `stop()` does, but keep
        the lease and claim nothing; once it is undrained, claim again at once."""
        if draining != self.draining:
            if draining:
                log.warning(
                    "node %s drained by the operator: preempting its jobs", self.config.name
                )
            else:
                log.warning("node %s undrained by the operator: claiming again", self.config.name)
            self.draining = draining
            self._changed.set()
        if draining:
            reason = drained(self.config.name)
            for running in self._running.values():
                running.attempt.stop(reason)

    async def _sweep_folders(self) -> None:
        while True:
            try:
                await self._folders.sweep()
            except UNAVAILABLE as exc:
                # Kept, with their uids, until a later sweep removes them.
                log.warning("removing expired job folders failed (%s); retrying", exc)
            await asyncio.sleep(self.config.folder_sweep_s)

    async def _check_gpus(self) -> None:
        for gpu in self._inventory.gpus():
            if not gpu.healthy and gpu.uuid not in self._unhealthy:
                log.warning("GPU %s is unhealthy: %s", gpu.uuid, gpu.health_reason)
                await self._port.mark_unhealthy(self.config.name, _info(gpu))
                self._unhealthy.add(gpu.uuid)

    async def _work(self) -> None:
        """Carry requests to running attempts, claim while work fits, wait for news: each
        round does what woke it calls for (`wakes.round_after`), and one every `poll_s` at
        least does all of it, so that a lost notification costs a poll interval at most."""
        loop = asyncio.get_running_loop()
        poll_at = loop.time()  # the first round does everything
        heard = self._heard()
        changed = False
        while not self._stopping.is_set():
            polled = loop.time() >= poll_at
            if polled:
                poll_at = loop.time() + self.config.poll_s
            before, heard = heard, self._heard()
            todo = round_after(before, heard, changed=changed, polled=polled)
            self._changed.clear()
            try:
                await self._round(todo)
            except UNAVAILABLE as exc:
                log.warning("claiming failed (%s); retrying", exc)
            waiting = {
                asyncio.ensure_future(self._listener.wait(heard.wakes)),
                asyncio.ensure_future(self._changed.wait()),
            }
            try:
                await asyncio.wait(
                    waiting,
                    timeout=max(0.0, poll_at - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for task in waiting:
                    task.cancel()
            changed = self._changed.is_set()

    def _heard(self) -> Heard:
        return Heard(
            wakes=self._listener.generation,
            claimable=self._listener.notified(CLAIMABLE_CHANNEL),
            requests=self._listener.notified(REQUESTS_CHANNEL),
        )

    async def _round(self, todo: Round) -> None:
        if todo.requests:
            await self._carry_requests()
        if todo.claim or todo.changed:
            # Until nothing more fits; woken by a claimable job or the poll, only while a GPU
            # is free (`Round`).
            while (
                not self._stopping.is_set()
                and not self.draining
                and (todo.changed or self._gpu_free())
                and (won := await self._claim())
            ):
                for taken in won:
                    specs = await self._prepare(taken)
                    if specs is not None:
                        self._start(taken, specs)
        if todo.requests:
            await self._account([])

    def _gpu_free(self) -> bool:
        """Whether a GPU of this node is free (`wakes.gpu_free`), as its running attempts
        tell: no query."""
        held = {
            gpu
            for running in self._running.values()
            for learner in running.attempt.claim.learners
            if learner.node == self.config.name
            for gpu in learner.gpus
        }
        return gpu_free(self._gpus, self._unhealthy, held)

    def _stop_attempts(self) -> None:
        for running in self._running.values():
            if self.fenced:
                running.attempt.fence()
            else:
                running.attempt.stop()

    async def _claim(self) -> list[Claim]:
        return await self._port.claim(self.config.name, uids=self._users.claimed)

    async def _prepare(self, won: Claim) -> list[LearnerSpec] | None:
        """`_specs_or_roll_back`, with the job's log opened here besides (before any learner
        writes: its lines count towards the job's log limits). The log's round trip goes side
        by side with the specs', not after them: a warm start waits for the slowest alone. Not
        a TaskGroup: the specs' errors are the caller's to see as they are (a group would wrap
        them), and an opening left behind is only cancelled."""
        job_id = won.job.job_id
        opening = asyncio.ensure_future(
            self._retry(lambda: self._logs.open(job_id, won.attempt, won.job.limits))
        )
        try:
            specs = await self._specs_or_roll_back(won)
        except BaseException:
            self._unopen(won, opening)
            raise
        if specs is None:
            self._unopen(won, opening)
            return None
        await opening
        return specs

    def _unopen(self, won: Claim, opening: asyncio.Future[None]) -> None:
        """The claimed attempt does not run here after all: its log's opening is cancelled,
        and the attempt closed if it was opened."""
        opening.cancel()
        self._logs.close(won.job.job_id, won.attempt)

    async def _specs_or_roll_back(self, won: Claim) -> list[LearnerSpec] | None:
        """The specs of this node's learners of the claim; None when they cannot run here for
        want of a uid or of a network across the job's nodes, and the deployment was rolled
        back (tried again, or the job failed after its deploy retries), its allocation here
        given back."""
        try:
            return await self._specs(won)
        except (NoUid, LinkError) as exc:
            job_id = won.job.job_id
            lacks = "uid" if isinstance(exc, NoUid) else "network across its nodes"
            reason = f"node {self.config.name} has no {lacks} for the job: {exc}"
            log.error("job %s attempt %d: %s", job_id, won.attempt, reason)
            await self._execute(
                job_id, RollBack(reason=reason, at=self._clock.now(), attempt=won.attempt)
            )
            await self._retry(lambda: self._port.release(self.config.name, job_id, won.attempt))
            return None

    async def _specs(self, won: Claim) -> list[LearnerSpec]:
        job_id = won.job.job_id
        # The job's secrets are read as each attempt starts, never kept: the table is their
        # only copy, and the job's end deletes them. Read while a warm sandbox is taken, each a
        # round trip: not a TaskGroup's siblings, as a failed read would cancel an adoption in
        # flight, which may commit all the same (the sandbox is then the job's, not the pool's).
        reading = asyncio.ensure_future(self._port.secret_env(job_id))
        try:
            # The same uid on every node and in every attempt of the job; its folders recorded
            # before any is made. A warm sandbox's uid becomes the job's as it takes it.
            warm = await self._take_warm(won)
        except BaseException:
            reading.cancel()
            raise
        try:
            secret_env = await reading
            if warm is not None and self._cold_because(won, secret_env) is not None:
                # Its secrets ask for what a warm sandbox lacks: the job keeps the uid it
                # adopted, and starts cold.
                await self._discard_warm(warm)
                warm = None
            return await self._specs_as(won, secret_env, warm)
        except BaseException:
            if warm is not None:
                await self._discard_warm(warm)  # the job's uid now: nothing to give back
            raise

    async def _specs_as(
        self, won: Claim, secret_env: Mapping[str, str], warm: WarmSandbox | None
    ) -> list[LearnerSpec]:
        job_id = won.job.job_id
        if warm is not None:
            user: tuple[int, int] | None = (warm.uid, warm.uid)  # its folders recorded as taken
        else:
            user = await self._users.of(job_id)
            await self._folders.record(
                job_id, None if user is None else user[0], checkpoints_of(won)
            )
        uid = None if user is None else user[0]
        specs = self._learner_specs(won, secret_env, user, await self._link(won, uid))
        if warm is not None:
            specs = [replace(spec, warm=warm.name) for spec in specs]
        return specs

    def _learner_specs(
        self,
        won: Claim,
        secret_env: Mapping[str, str],
        user: tuple[int, int] | None,
        link: JobLink | None,
    ) -> list[LearnerSpec]:
        return learner_specs(
            won,
            link=link,
            secret_env=secret_env,
            node=self.config.name,
            work_dir=self.config.work_dir,
            checkpoint_root=self.config.checkpoint_root,
            launcher=list(self.config.launcher),
            network_tenants=self.config.network_tenants,
            roots=self.config.roots,
            user=user,
            container=self._runtime.name == "docker",
        )

    async def _take_warm(self, won: Claim) -> WarmSandbox | None:
        """A warm sandbox for the claim's only learner, its uid now the job's and its folders
        here recorded under it; None when the job has others, its learner would get another
        sandbox (`WarmSandboxes.refusal`, judged without the job's secrets: see `_specs`), one
        of its uid's may be in use (it has folders), or none is ready."""
        job = won.job
        if self._warm is None:
            return None
        # Judged before one is taken: a learner that starts cold costs the pool nothing.
        if (refusal := self._cold_because(won, {})) is not None:
            log.info("job %s starts cold: %s", job.job_id, refusal)
            return None
        warm = self._warm.take()
        if warm is None:
            return None
        try:
            uid = await self._users.adopt_warm(
                job.job_id, self.config.name, warm.placeholder, checkpoints_of(won)
            )
        except BaseException:
            self._warm.give_back(warm)  # its uid is still its own
            raise
        if uid is None:
            self._warm.give_back(warm)
            return None
        return warm

    def _cold_because(self, won: Claim, secret_env: Mapping[str, str]) -> str | None:
        """Why the claim's learner cannot start in a warm sandbox here, given the job's
        `secret_env`; None when it can."""
        job = won.job
        runtime = self._runtime
        if not isinstance(runtime, ProcessRuntime) or runtime.warm is None:
            return "the runtime keeps no warm sandboxes"
        if job.manifest.learners != 1 or won.nodes != [self.config.name]:
            return "its job has other learners"
        if job.tenant in self.config.network_tenants:
            return "its tenant's learners use the network"
        # Its uid and link change nothing of it (one learner here, no link).
        (probe,) = self._learner_specs(won, secret_env, None, None)
        return runtime.warm.refusal(probe, self.config.launcher)

    async def _discard_warm(self, warm: WarmSandbox) -> None:
        runtime = self._runtime
        assert isinstance(runtime, ProcessRuntime) and runtime.warm is not None
        runtime.warm.let_go(warm.name)
        await runtime.warm.discard(warm)

    async def _link(self, won: Claim, uid: int | None) -> JobLink | None:
        """This node's part of the job's network across nodes: for a job whose learners span
        nodes and run as a uid of the job's (sandboxed processes, or containers) without the
        network, on nodes that all gave their address (`--node-address`): without one, the
        learners run as before the network across nodes was built, each node's on its own
        (a job whose learners do not talk across nodes runs; one whose rendezvous spans them
        fails it within its timeout, with the reason). LinkError when an address is bad."""
        if (
            uid is None
            or len(won.nodes) < 2
            or self._runtime.name not in ("process", "docker")
            or won.job.tenant in self.config.network_tenants
        ):
            return None
        addresses = await self._port.node_addresses(won.nodes)
        plan = self.config.job_network.key(self.config.learner_uids.start)
        if (reason := unlinked_because(won.nodes, addresses, plan)) is not None:
            log.warning(
                "job %s attempt %d: no network across its nodes: %s",
                won.job.job_id,
                won.attempt,
                reason,
            )
            return None
        index = uid - self.config.learner_uids.start  # the job's alone across the fleet
        at = {node: found.address for node, found in addresses.items()}
        return job_link(self.config.job_network, index, won.nodes, self.config.name, at)

    def _start(
        self, won: Claim, specs: list[LearnerSpec], adopted: Mapping[int, Learner] | None = None
    ) -> None:
        job_id = won.job.job_id

        async def execute(command: Command) -> Job | None:
            return await self._execute(job_id, command)

        attempt = Attempt(
            won,
            specs,
            self._runtime,
            self._logs,
            execute,
            grace_s=self.config.grace_s,
            adopted=adopted,
            clock=self._clock,
        )
        log.info("job %s attempt %d: running %d learner(s)", job_id, won.attempt, len(specs))
        last = self._running.get(job_id)
        if last is not None and last.attempt.claim.attempt < won.attempt:
            # The job's next attempt was claimed here before a round carried the last one's
            # end to it (a round woken by a learner's end claims without reading the jobs'
            # news), and its entry is taken now: nothing would stop the last one after this.
            last.attempt.fence()
        self._running[job_id] = _Running(attempt, version=won.version)
        if self._attempts is not None:
            self._launch(self._attempts, attempt)

    def _launch(self, group: asyncio.TaskGroup, attempt: Attempt) -> None:
        job_id = attempt.claim.job.job_id
        group.create_task(self._run_attempt(attempt), name=f"attempt-{job_id}")

    async def _run_attempt(self, attempt: Attempt) -> None:
        """Run the attempt and give back what it held; its failure is logged, never raised:
        it would end the agent's other attempts (their group cancels them)."""
        try:
            await self._attempt(attempt)
        except Exception:
            log.exception("job %s: the attempt failed unexpectedly", attempt.claim.job.job_id)

    async def _attempt(self, attempt: Attempt) -> None:
        job_id = attempt.claim.job.job_id
        try:
            servable = attempt.claim.job.manifest.servable
            if servable is None or self._serving is None or not attempt.specs:
                await attempt.run()
            else:
                async with asyncio.TaskGroup() as group:
                    feed = group.create_task(self._feed(self._serving, attempt, servable))
                    await attempt.run()
                    feed.cancel()
        finally:
            # The learners have ended. Their containers go once their last lines are stored
            # (until then the engine holds the only copy), and before their GPUs go back, so
            # that the next job never shares a GPU with a container still being torn down.
            # Both are retried until the database answers, or the GPUs would stay allocated.
            await self._retry(self._logs.flush)
            self._logs.close(job_id, attempt.claim.attempt)
            await attempt.remove_learners()
            number = attempt.claim.attempt
            await self._retry(lambda: self._port.release(self.config.name, job_id, number))
            # Once its GPUs are back, the job's next attempt may already have been claimed
            # here (a rollback, a restart): that one is running now, under the same job id,
            # and keeps its entry.
            current = self._running.get(job_id)
            if current is not None and current.attempt is attempt:
                del self._running[job_id]
            self._changed.set()

    async def _feed(self, serving: Serving, attempt: Attempt, servable: ServableSpec) -> None:
        """Feed a deployment's replica while its attempt runs; a failure here is logged and
        ends the feeding only (the lifecycle manager replaces a replica that takes no tasks),
        and the tasks it held go back to the queue."""
        spec = attempt.specs[0]
        job = attempt.claim.job
        try:
            await serving.run(
                job.tenant,
                job.job_id,
                servable,
                Path(spec.env[SERVE_DIR]),
                lambda text: self._logs.add(spec, "system", text),
                attempt.share_cpu,
            )
        except Exception:
            log.exception("job %s: feeding its replica failed", job.job_id)
        finally:
            await asyncio.shield(self._retry(lambda: serving.requeue(job.job_id)))

    async def _execute(self, job_id: UUID, command: Command) -> Job | None:
        actor = f"agent:{self.config.name}"
        try:
            return await self._retry(lambda: self._port.execute(job_id, command, actor))
        except Refused as exc:
            log.info("job %s: %s refused: %s", job_id, type(command).__name__, exc)
            return None

    async def _carry_requests(self) -> None:
        """Cancel and checkpoint requests (and restarts decided elsewhere) for running jobs."""
        for job_id, running in list(self._running.items()):
            for news in await self._port.news(job_id, running.version):
                running.version = news.version
                match news.event:
                    case JobCancelled():
                        running.attempt.cancel()
                    case JobRestarted() | DeploymentRolledBack() | JobFailed():
                        # Over without this node's say: restarted elsewhere (this node was
                        # declared lost), rolled back, or failed by a learner on another node.
                        running.attempt.fence()
                    case CheckpointRequested():
                        running.attempt.request_checkpoint()

    async def _retry(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Retry through database outages, with backoff: an event of a running job must not
        be lost because Postgres restarted."""
        delay = RETRY_MIN_S
        while True:
            try:
                return await operation()
            except UNAVAILABLE as exc:
                log.warning("database unavailable (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)


def _info(gpu: Gpu) -> GpuInfo:
    """The inventory's view of a GPU as the node's events and tables record it."""
    return GpuInfo(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        memory_mb=gpu.memory_mb,
        healthy=gpu.healthy,
        health_reason=gpu.health_reason,
    )
