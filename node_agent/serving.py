"""Feeding a deployment's replica: the agent delivers the model's artifact to it, then takes
its deployment's tasks from the queue in batches, has the replica run them, and records the
results, fenced by each batch's claim.

A batch holds at most `max_batch_size` items (counted in items, not tasks); it leaves when full
or when its oldest task has waited `max_wait_ms`, and which of the two is recorded. A task of
more items than that is run in calls of at most `max_batch_size` each, each call recorded as a
batch of its own.

The replica runs the tenant's code; the agent never runs it. What it answers is checked (one
output per item) and stored as JSON; a failure in the tenant's code fails the batch's tasks
with its traceback. A replica that dies gives its tasks back to the queue at once; one that
hangs holds them until the lifecycle manager sees its task timeout pass, replaces it, and
gives them back (controlplane/deployments/controller.py, a step of the lifecycle manager).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from uuid import UUID, uuid4

from controlplane.agent_port.protocol import QueryQueue, ServingChannels, ServingQueue
from controlplane.agent_port.vocabulary import (
    UNAVAILABLE,
    BatchCall,
    ClaimedTask,
    ServableSpec,
    TaskResults,
)
from controlplane.agent_port.wakes import Wakeups, queue_key
from node_agent.inference import QueryFeed, stored
from node_agent.packages import PackagesError, Site
from node_agent.replica_calls import call_in_parts, ms_since, recorded_calls
from node_agent.replica_client import ReplicaClient, ReplicaError, ReplicaGone, ReplicaRefused
from node_agent.runtime import CpuShare
from node_agent.serving_channel import DirectFeed, ServingChannel

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 120.0
"""How long a replica may take from its start to listening on its socket."""
RETRY_S = 0.5
LOAD_BOOST_S = 10.0
"""How long a replica loading its model may take more of the node's CPUs than its own
(`CpuShare.LOADING`): the model's code is the tenant's, and a load that never ends must not
keep them."""
T = TypeVar("T")
ShareCpu = Callable[[CpuShare], Awaitable[None]]
"""Gives the replica's learner a share of the node's CPUs (`Attempt.share_cpu`)."""


@dataclass(frozen=True, slots=True)
class Claimed:
    task_id: UUID
    items: int
    inputs: list[Any]


@dataclass
class Batch:
    claim: UUID
    tasks: list[Claimed]
    waited_ms: float
    """How long its oldest task had been queued when it was first claimed."""

    @property
    def items(self) -> int:
        return sum(task.items for task in self.tasks)


class Feeds(ServingQueue, ServingChannels, QueryQueue, Protocol):
    """What feeding replicas asks of the control plane: deployments' tasks, the replicas'
    channels, inference jobs' queries."""


class Serving:
    """The agent's side of serving: one per agent, shared by its replicas."""

    def __init__(
        self,
        port: Feeds,
        listener: Wakeups,
        artifacts_dir: Path | None,
        site: Site,
        node: str,
        channel: ServingChannel | None = None,
    ) -> None:
        self._port = port
        self._channel = channel
        """Where the control plane sends synchronous predictions (None: they all queue)."""
        self.node = node
        self.listener = listener
        """Woken by the `serving` channel: each deployment's feeds by tasks queued for it."""
        self._artifacts_dir = artifacts_dir
        self.site = site
        """Where this node's replicas find their models' requirements installed."""

    def artifact(self, sha256: str) -> Path | None:
        """Where the model repository keeps the blob (a folder it shares with this node)."""
        if self._artifacts_dir is None:
            return None
        return self._artifacts_dir / "sha256" / sha256[:2] / sha256[2:4] / sha256

    async def run(
        self,
        tenant: str,
        job_id: UUID,
        servable: ServableSpec,
        serve_dir: Path,
        note: Callable[[str], None],
        share_cpu: ShareCpu,
    ) -> None:
        """Feed the replica of `job_id` (listening in `serve_dir`) until cancelled (its attempt
        ended) or it is gone; `note` adds a line to the job's log; `share_cpu` sets its share
        of the node's CPUs as it loads its model, and once it has."""
        replica = _Replica(self, tenant, job_id, servable, note, share_cpu)
        await replica.run(_work_dir(serve_dir, job_id), serve_dir)

    async def claim(
        self,
        tenant: str,
        deployment: str,
        most_items: int,
        replica: UUID,
        claim: UUID,
        known: Sequence[UUID] = (),
    ) -> list[ClaimedTask]:
        """Tasks taken under `claim`: those it holds besides `known` (a try whose answer was
        lost took them), else new ones."""
        return await self._port.claim_tasks(tenant, deployment, most_items, claim, replica, known)

    async def finish(
        self,
        batch: Batch,
        outcome: tuple[list[str | None], list[str | None]],
        *,
        tenant: str,
        deployment: str,
        replica: UUID,
        reason: str,
        invocation_ms: float,
        inference_ms: float | None,
        calls: tuple[BatchCall, ...],
    ) -> int:
        outputs, errors = outcome
        return await self._port.finish_tasks(
            TaskResults(
                claim=batch.claim,
                task_ids=[task.task_id for task in batch.tasks],
                outputs=outputs,
                errors=errors,
                tenant=tenant,
                deployment=deployment,
                replica=replica,
                items=batch.items,
                reason=reason,
                invocation_ms=invocation_ms,
                inference_ms=inference_ms,
                calls=calls,
            )
        )

    @contextlib.asynccontextmanager
    async def direct(
        self,
        tenant: str,
        replica: UUID,
        servable: ServableSpec,
        retry: Callable[[Callable[[], Awaitable[None]]], Awaitable[None]],
        *,
        streams: bool = False,
    ) -> AsyncIterator[DirectFeed | None]:
        """The replica's feed of direct requests, offered on the agent's channel for the
        block (None: the agent has no channel); `streams`: its model streams. Withdrawn first
        when the block ends: a request that still comes is refused, and takes the queue."""
        channel = self._channel
        if channel is None:
            yield None
            return
        feed = DirectFeed(replica, tenant, servable, streams=streams)
        channel.feeds[replica] = feed
        try:
            await retry(
                lambda: self._port.offer_channel(
                    replica,
                    tenant,
                    servable.deployment,
                    self.node,
                    channel.address,
                    channel.token,
                )
            )
            yield feed
        finally:
            if channel.feeds.get(replica) is feed:
                del channel.feeds[replica]
            feed.close("the replica stopped serving")
            # Shielded and best effort: a row left behind is refused by this channel (no
            # such replica), and its replica's retirement leaves it out of every route.
            with contextlib.suppress(*UNAVAILABLE):
                await asyncio.shield(self._port.withdraw_channel(replica))

    async def requeue(self, replica: UUID) -> None:
        """Give back what the replica held: its deployment's tasks, or its job's queries."""
        await self._port.requeue_replica(replica)

    def queries(self, job_id: UUID, replica: UUID, note: Callable[[str], None]) -> QueryFeed:
        """The feed of an inference job's queries for one of its replicas."""
        return QueryFeed(
            self._port, self.listener, job_id=job_id, replica=replica, node=self.node, note=note
        )


@contextlib.asynccontextmanager
async def loading(share_cpu: ShareCpu, boost_s: float) -> AsyncIterator[None]:
    """A replica's CPU share while it loads its model: LOADING for `boost_s` at most, SERVING
    after that, and once the load has ended, however it ended."""
    await share_cpu(CpuShare.LOADING)
    bounded = asyncio.create_task(_serving_after(share_cpu, boost_s))
    try:
        yield
    finally:
        bounded.cancel()
        await asyncio.shield(share_cpu(CpuShare.SERVING))


async def _serving_after(share_cpu: ShareCpu, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    await share_cpu(CpuShare.SERVING)


class _Replica:
    def __init__(
        self,
        serving: Serving,
        tenant: str,
        job_id: UUID,
        servable: ServableSpec,
        note: Callable[[str], None],
        share_cpu: ShareCpu,
    ) -> None:
        self._serving = serving
        self._tenant = tenant
        self._job_id = job_id
        self._spec = servable
        self._note = note
        self._share_cpu = share_cpu
        self._load_error: str | None = None
        """Why the model could not be loaded: every task this replica takes fails with it."""

    async def run(self, work_dir: Path, serve_dir: Path) -> None:
        # Tasks an earlier agent's feed held for this replica (it was killed mid-batch): the
        # results it never recorded are produced again, once.
        await self._retry(lambda: self._serving.requeue(self._job_id))
        try:
            client = await ReplicaClient.connect(work_dir, serve_dir, timeout_s=CONNECT_TIMEOUT_S)
        except ReplicaRefused as exc:
            self._note(f"[trainyard] the replica's socket is refused: {exc}")
            raise
        try:
            await self._load(client)
            job = self._spec.inference_job
            if job is not None:
                feed = self._serving.queries(job, self._job_id, self._note)
                await feed.run(client, self._load_error, self._retry)
            else:
                await self._serve(client)
        except* ReplicaGone:
            # Also from within an inference query's task group (node_agent/inference.py).
            self._note("[trainyard] replica stopped answering: its tasks go back to the queue")
            await self._retry(lambda: self._serving.requeue(self._job_id))
        finally:
            await asyncio.shield(client.close())

    async def _serve(self, client: ReplicaClient) -> None:
        """The queue's tasks, and (a model loaded) the direct path's requests, in turns."""
        if self._load_error is not None:
            await self._rows(client)  # each task fails with the load's error, recorded
            return
        async with (
            self._serving.direct(
                self._tenant, self._job_id, self._spec, self._retry, streams=client.streams
            ) as feed,
            asyncio.TaskGroup() as group,
        ):
            if feed is not None:
                group.create_task(feed.run(client), name=f"direct-{self._job_id}")
            group.create_task(self._rows(client), name=f"rows-{self._job_id}")

    async def _rows(self, client: ReplicaClient) -> None:
        while True:
            batch = await self._next_batch()
            await self._run_batch(client, batch)

    async def _load(self, client: ReplicaClient) -> None:
        # Within its own CPUs but for the load this agent sends: an earlier agent that died
        # during one left the replica without a quota (and its hello waits for that load).
        await self._share_cpu(CpuShare.SERVING)
        if await client.hello():
            return  # loaded before this agent (re)started
        artifact = self._serving.artifact(self._spec.artifact_sha256)
        if artifact is None or not artifact.is_file():
            self._load_error = (
                f"the model's artifact {self._spec.artifact_sha256} is not on node "
                "(the agent's --artifacts-dir must be the model repository's folder)"
            )
        else:
            try:
                site = await self._packages()
                async with loading(self._share_cpu, LOAD_BOOST_S):
                    load_ms = await client.load(
                        artifact, self._spec.artifact_sha256, self._spec.entry_point, site
                    )
                self._note(f"[trainyard] model loaded in {load_ms:.0f} ms")
                return
            except PackagesError as exc:
                self._load_error = f"the model's requirements could not be installed: {exc}"
            except ReplicaError as exc:
                self._load_error = f"the model failed to load: {exc}"
        self._note(f"[trainyard] {self._load_error}; its tasks fail with this error")

    async def _packages(self) -> Path | None:
        """Where the model's requirements are installed (None: it lists none)."""
        requirements = self._spec.requirements
        if not requirements:
            return None
        started = time.monotonic()
        site = await self._serving.site(requirements)
        took = time.monotonic() - started
        self._note(f"[trainyard] requirements ready in {took:.1f}s: {', '.join(requirements)}")
        return site

    async def _next_batch(self) -> Batch:
        """Claimed tasks up to max_batch_size items: once one is queued, more are taken as
        they come until the batch is full or its oldest task has waited max_wait_ms."""
        most = self._spec.max_batch_size
        claim = uuid4()
        listener = self._serving.listener
        key = queue_key(self._tenant, self._spec.deployment)
        tasks: list[Claimed] = []
        deadline = 0.0
        waited_ms = 0.0
        while True:
            seen = listener.seen(key)
            rows = await self._retry(
                lambda: self._serving.claim(
                    self._tenant,
                    self._spec.deployment,
                    most - sum(t.items for t in tasks),
                    self._job_id,
                    claim,
                    [t.task_id for t in tasks],
                )
            )
            if rows and not tasks:
                waited_ms = max(row.age_ms for row in rows)
                deadline = time.monotonic() + max(0.0, self._spec.max_wait_ms - waited_ms) / 1000
            tasks.extend(Claimed(row.task_id, row.items, json.loads(row.input)) for row in rows)
            if not tasks:
                await listener.wait_for(key, seen)
                continue
            left = deadline - time.monotonic()
            if sum(t.items for t in tasks) >= most or left <= 0:
                return Batch(claim, tasks, waited_ms)
            try:
                async with asyncio.timeout(left):
                    await listener.wait_for(key, seen)
            except TimeoutError:
                pass

    async def _run_batch(self, client: ReplicaClient, batch: Batch) -> None:
        most = self._spec.max_batch_size
        reason = "full" if batch.items >= most else "timeout"
        started = time.monotonic()
        inference_ms: float | None = None
        calls: list[BatchCall] = []
        if self._load_error is not None:
            outcome = _failed(batch.tasks, self._load_error)
        else:
            items = [item for task in batch.tasks for item in task.inputs]
            ran = await call_in_parts(client, items, most)
            calls, inference_ms = ran.calls, ran.inference_ms
            if ran.error is not None:
                outcome = _failed(batch.tasks, ran.error)
            else:
                outcome = _split(batch.tasks, ran.outputs)
        invocation_ms = ms_since(started)
        await self._retry(
            lambda: self._serving.finish(
                batch,
                outcome,
                tenant=self._tenant,
                deployment=self._spec.deployment,
                replica=self._job_id,
                reason=reason,
                invocation_ms=invocation_ms,
                inference_ms=inference_ms,
                calls=recorded_calls(batch.items, most, calls),
            )
        )

    async def _retry(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Through database outages: a claimed batch's results must not be lost because
        Postgres restarted (until the lifecycle manager requeues its tasks)."""
        while True:
            try:
                return await operation()
            except UNAVAILABLE as exc:
                log.warning("replica %s: database unavailable (%s); retrying", self._job_id, exc)
                await asyncio.sleep(RETRY_S)


def _work_dir(serve_dir: Path, job_id: UUID) -> Path:
    """The agent's folder that holds the job's (`node_agent.learners.job_dir`, named by the
    job's id), which the replica cannot write: where the way to its socket starts."""
    for folder in serve_dir.parents:
        if folder.name == str(job_id):
            return folder.parent
    raise ValueError(f"{serve_dir} is not in a folder of job {job_id}")


def _split(
    tasks: Sequence[Claimed], outputs: list[Any]
) -> tuple[list[str | None], list[str | None]]:
    """Each task's outputs (its items' share of the batch's, in order) as JSON text; what
    Postgres's jsonb cannot hold (NaN, infinities, NUL characters) fails the task instead."""
    texts: list[str | None] = []
    errors: list[str | None] = []
    at = 0
    for task in tasks:
        text, error = stored(outputs[at : at + task.items])
        texts.append(text)
        errors.append(error)
        at += task.items
    return texts, errors


def _failed(tasks: Sequence[Claimed], why: str) -> tuple[list[str | None], list[str | None]]:
    return [None] * len(tasks), [why] * len(tasks)
