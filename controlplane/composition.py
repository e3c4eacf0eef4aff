"""The composition root: which parts the control plane is made of and how they are wired.

Every program that runs the control plane's parts builds them here: `trainyard serve` and
`trainyard up` (through `controlplane.http.app`), the CLI's projection commands, the tests'
cluster and the benchmarks. Front ends (HTTP today, a dashboard tomorrow) get the parts from
here and never assemble them themselves. Its stores read and write with
`event_registry.EVENT_REGISTRY`, as the node agent's does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg

from controlplane.agents.lost_nodes import LostNodes
from controlplane.agents.manager import LifecycleManager
from controlplane.artifacts.store import ArtifactStore
from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.cluster_gauges import ClusterGauges
from controlplane.database import DATABASE_ERRORS, create_pool, ping
from controlplane.deployments.controller import DeploymentController
from controlplane.deployments.counting import Counting
from controlplane.deployments.direct import DirectPath
from controlplane.deployments.projection import DeploymentsProjection
from controlplane.deployments.retention import MemoEviction, TaskRetention
from controlplane.deployments.service import Deployments
from controlplane.deployments.tasks import Tasks
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.hub import StreamHub
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.inference.service import Inference
from controlplane.inference.sweep import InferenceSweep
from controlplane.jobs.deploy_timeouts import DeployTimeouts
from controlplane.jobs.locations import Roots
from controlplane.jobs.projection import JobsProjection
from controlplane.jobs.retention import JobRetention
from controlplane.jobs.service import Jobs
from controlplane.logs.indexer import DEFAULT_LOG_INDEXERS, LogIndexers
from controlplane.models.projection import ModelsProjection
from controlplane.models.service import Models
from controlplane.pending.apart import RecorderProcess
from controlplane.pending.projection import PendingProjection
from controlplane.pending.recorder import PendingRecorder
from controlplane.projections.base import Projection
from controlplane.projections.runner import ProjectionRunner
from controlplane.projections.streams import StreamsProjection
from controlplane.scheduling.projection import SchedulingProjection
from controlplane.searches.driver import SearchDriver
from controlplane.searches.projection import SearchesProjection
from controlplane.searches.service import Searches
from controlplane.sweeps import Sweep
from controlplane.tenants.principals import Principals
from controlplane.tenants.projection import TenantsProjection
from controlplane.webhooks.outbox import WebhookOutbox
from controlplane.webhooks.relay import RelayConfig, WebhookRelay

log = logging.getLogger(__name__)

STOP_S = 10.0
"""How long the background tasks get to stop on their own before they are cancelled."""


def projections() -> list[Projection]:
    """Every projection the control plane runs, in the order a round applies them: the jobs'
    first, whose queue rows a claim waits for (a trial's next job, a replica's), and which
    wake the agents as they commit."""
    return [
        JobsProjection(),
        StreamsProjection(),
        TenantsProjection(),
        SchedulingProjection(),
        ModelsProjection(),
        DeploymentsProjection(),
        PendingProjection(),
        SearchesProjection(),
        WebhookOutbox(),
    ]


def projection_runner(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener
) -> ProjectionRunner:
    """A runner of every projection."""
    return ProjectionRunner(pool, store, listener, projections())


def sweeps(
    pool: asyncpg.Pool,
    store: EventStore,
    deployments: Deployments,
    inference: Inference,
    *,
    clock: Clock,
    log_retention_s: float,
) -> list[Sweep]:
    """Every step of the lifecycle manager's sweep, in the order it runs them: nodes first (a
    job on a lost node goes back to the queue before anything else looks at it), retention
    last (what it lets go is what nothing else needs any more). `log_retention_s`: how long
    after a job ended its log lines, folders and uid go (0: never)."""
    return [
        LostNodes(pool, store, clock),
        DeployTimeouts(pool, store, clock),
        DeploymentController(pool, deployments),
        MemoEviction(pool),
        TaskRetention(pool),
        InferenceSweep(inference),
        JobRetention(pool, log_retention_s),
    ]


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether this replica should take traffic, and if not, why."""

    database: bool
    projections_caught_up: bool
    background_tasks: bool
    stopped_projections: dict[str, str]
    """Projections stopped on an event they kept failing on: name → what stopped them."""

    @property
    def ready(self) -> bool:
        return (
            self.database
            and self.projections_caught_up
            and self.background_tasks
            and not self.stopped_projections
        )


class ControlPlane:
    """The control plane's parts on one pool: the store, the job service, and the background
    workers (log listener, projection runner, SSE hub, lifecycle manager, cluster gauges,
    pending-reasons recorder, search driver, webhook relay, log search's indexers), all on one
    clock (the system's, but for tests of time)."""

    def __init__(
        self,
        url: str,
        pool: asyncpg.Pool,
        *,
        poll_interval: float,
        relay: RelayConfig,
        projections: Sequence[Projection],
        artifacts: ArtifactStore,
        roots: Roots,
        log_retention_s: float,
        log_indexers: int = DEFAULT_LOG_INDEXERS,
        pending_apart: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.url = url
        self.clock = clock
        self.pool = pool
        self.listener = LogListener(url, poll_interval=poll_interval)
        self.store = EventStore(pool, EVENT_REGISTRY)
        self.projections = ProjectionRunner(pool, self.store, self.listener, projections)
        self.hub = StreamHub(self.store, self.listener)
        self.jobs = Jobs(self.store, clock)
        self.models = Models(self.store, artifacts, self.jobs, roots=roots, clock=clock)
        self.deployments = Deployments(self.store, self.jobs, self.models, clock)
        self.tasks = Tasks(pool, url, poll_interval=poll_interval)
        self.direct = DirectPath(pool, self.deployments)
        self.counting = Counting(pool)
        self.principals = Principals()
        self.inference = Inference(pool, self.jobs, self.models, self.deployments, clock)
        self.manager = LifecycleManager(
            url,
            sweeps(
                pool,
                self.store,
                self.deployments,
                self.inference,
                clock=clock,
                log_retention_s=log_retention_s,
            ),
        )
        self.gauges = ClusterGauges(pool)
        # Apart: in a process of its own, off the API's interpreter (see `pending.apart`).
        self.pending: PendingRecorder | RecorderProcess = (
            RecorderProcess(url)
            if pending_apart
            else PendingRecorder(pool, self.store, clock=clock)
        )
        self.searches = Searches(self.store, self.jobs, clock)
        self.driver = SearchDriver(pool, self.searches, self.listener)
        self.webhooks = WebhookRelay(url, pool, self.store, relay, clock=clock)
        self.log_indexers = LogIndexers(pool, count=log_indexers)

    async def apart(self) -> None:
        """Return once the parts that run in processes of their own are up: the pending-reasons
        recorder, when it runs apart."""
        if isinstance(self.pending, RecorderProcess):
            await self.pending.up.wait()

    async def readiness(self, background: asyncio.Task[None]) -> Readiness:
        """What `/readyz` reports, with `background` the task that `running` started."""
        try:
            await ping(self.pool)
            database = True
            caught_up = await self.projections.caught_up()
        except DATABASE_ERRORS:
            database = caught_up = False
        return Readiness(
            database=database,
            projections_caught_up=caught_up,
            background_tasks=not background.done(),
            stopped_projections=self.projections.stopped(),
        )


@asynccontextmanager
async def opened(
    url: str,
    *,
    poll_interval: float = 1.0,
    relay: RelayConfig | None = None,
    only: Sequence[Projection] | None = None,
    artifacts: ArtifactStore,
    roots: Roots,
    log_retention_s: float,
    log_indexers: int = DEFAULT_LOG_INDEXERS,
    pending_apart: bool = False,
) -> AsyncIterator[ControlPlane]:
    """The control plane's parts on a fresh pool, closed (relay, store, pool) when the block
    ends; nothing runs until `running`. `only`: the projections to run (default: every one);
    `artifacts`: the model repository's store; `roots`: where `file://` results may be read;
    `log_retention_s`: how long after a job ended its log lines go (0: never); `log_indexers`:
    how many of log search's indexers this replica runs; `pending_apart`: whether its
    pending-reasons recorder runs in a process of its own (as `trainyard serve` runs it)."""
    pool = await create_pool(url)
    try:
        plane = ControlPlane(
            url,
            pool,
            poll_interval=poll_interval,
            relay=relay or RelayConfig(),
            projections=projections() if only is None else only,
            artifacts=artifacts,
            roots=roots,
            log_retention_s=log_retention_s,
            log_indexers=log_indexers,
            pending_apart=pending_apart,
        )
        try:
            yield plane
        finally:
            await plane.webhooks.close()
            await plane.direct.close()
            await plane.store.close()
    finally:
        await pool.close()


@asynccontextmanager
async def running(plane: ControlPlane) -> AsyncIterator[asyncio.Task[None]]:
    """The background workers, siblings that stop together, for the length of the block; yields
    the task that supervises them (done: they failed). When the block ends each is asked to
    stop, then cancelled after STOP_S."""

    async def supervise() -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(plane.listener.run(), name="log-listener")
                group.create_task(plane.projections.run(), name="projection-runner")
                group.create_task(plane.hub.run(), name="sse-hub")
                group.create_task(plane.manager.run(), name="lifecycle-manager")
                group.create_task(plane.gauges.run(), name="cluster-gauges")
                group.create_task(plane.pending.run(), name="pending-reasons")
                group.create_task(plane.driver.run(), name="search-driver")
                group.create_task(plane.webhooks.run(), name="webhook-relay")
                group.create_task(plane.tasks.run(), name="serving-tasks")
                group.create_task(plane.counting.run(), name="serving-counting")
                group.create_task(plane.principals.run(plane.pool), name="token-refresh")
                group.create_task(plane.log_indexers.run(), name="log-indexers")
        except Exception:
            # The server keeps answering, but /readyz now says "not ready", so a load
            # balancer or supervisor takes this replica out of service.
            log.exception("a background task of the control plane failed")
            raise

    task = asyncio.create_task(supervise(), name="control-plane-background")
    try:
        yield task
    finally:
        plane.hub.stop()
        plane.manager.stop()
        plane.gauges.stop()
        plane.pending.stop()
        plane.driver.stop()
        plane.webhooks.stop()
        plane.tasks.stop()
        plane.counting.stop()  # after the requests: it writes what they left, then ends
        plane.principals.stop()
        plane.log_indexers.stop()
        plane.listener.stop()
        plane.projections.stop()
        plane.listener.wake()  # the runner and the hub wait on the listener: let them see it
        await asyncio.wait({task}, timeout=STOP_S)
        if not task.done():
            task.cancel()
        # Retrieve the outcome (already logged by `supervise`) before the pool closes.
        await asyncio.gather(task, return_exceptions=True)
