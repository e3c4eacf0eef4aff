"""The control plane's aiohttp application: routes and middlewares over the parts that the
composition root (`controlplane.composition`) builds, started and stopped with the app."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from functools import partial

from aiohttp import web

from controlplane.artifacts.filesystem import FileArtifactStore, default_root
from controlplane.artifacts.store import ArtifactStore
from controlplane.composition import opened, running
from controlplane.http import (
    deployments,
    inference,
    jobs,
    logs,
    metrics,
    models,
    nodes,
    openapi,
    pending,
    probes,
    scheduling,
    scrape,
    searches,
    tenants,
    ui,
    webhooks,
)
from controlplane.http.auth import PRINCIPALS, auth_middleware
from controlplane.http.errors import refusal_middleware
from controlplane.http.keys import (
    BACKGROUND,
    DATABASE_URL,
    DEPLOYMENTS,
    GAUGES,
    HUB,
    IMAGES,
    INFERENCE,
    JOBS,
    LOCATION_ROOTS,
    MODELS,
    PLANE,
    POOL,
    PROJECTIONS,
    SSE_HEARTBEAT_S,
    STORE,
    SUBMISSIONS,
    TASKS,
    WEBHOOKS,
)
from controlplane.http.outage import outage_middleware
from controlplane.http.streams import DEFAULT_MAX_STREAMS, STREAMS, LiveStreams
from controlplane.http.tracing import tracing_middleware
from controlplane.jobs.images import ImageAllowlist
from controlplane.jobs.locations import Roots
from controlplane.logs.indexer import DEFAULT_LOG_INDEXERS
from controlplane.projections.base import Projection
from controlplane.settings import LOG_RETENTION_S, Settings
from controlplane.tenants.submissions import SubmissionRates
from controlplane.webhooks.relay import RelayConfig


def create_app(
    database_url: str,
    *,
    poll_interval: float = 1.0,
    sse_heartbeat_s: float = 15.0,
    relay: RelayConfig | None = None,
    images: ImageAllowlist | None = None,
    roots: Roots | None = None,
    max_streams: int = DEFAULT_MAX_STREAMS,
    projections: Sequence[Projection] | None = None,
    artifacts: ArtifactStore | None = None,
    log_retention_s: float = LOG_RETENTION_S,
    log_indexers: int = DEFAULT_LOG_INDEXERS,
    pending_apart: bool = False,
) -> web.Application:
    """The application; `images` None: the allowlist `TRAINYARD_IMAGES` sets (ValueError when
    it is malformed), or the default; `roots`: where `file://` data and results may be
    (default: from the environment); `projections`: those this replica runs (default: all);
    `artifacts`: the model repository's store (default: the directory `Settings` names);
    `log_retention_s`: how long after a job ended its log lines go (0: never); `log_indexers`:
    how many of log search's indexers this replica runs; `pending_apart`: whether the
    pending-reasons recorder runs in a process of its own (`trainyard serve`: see
    `controlplane.pending.apart`) rather than in this one."""
    app = web.Application(
        middlewares=[tracing_middleware, outage_middleware, refusal_middleware, auth_middleware]
    )
    app[DATABASE_URL] = database_url
    app[IMAGES] = ImageAllowlist.from_env(os.environ) if images is None else images
    app[SSE_HEARTBEAT_S] = sse_heartbeat_s
    app[LOCATION_ROOTS] = roots if roots is not None else Roots.from_env()
    app[SUBMISSIONS] = SubmissionRates()
    app[STREAMS] = LiveStreams(max_streams)
    app.cleanup_ctx.append(
        partial(
            _database,
            poll_interval=poll_interval,
            relay=relay,
            only=projections,
            artifacts=artifacts or FileArtifactStore(default_root(Settings.from_env())),
            log_retention_s=log_retention_s,
            log_indexers=log_indexers,
            pending_apart=pending_apart,
        )
    )
    app.cleanup_ctx.append(_background)
    # Open SSE streams end first, so that shutdown does not wait for their clients.
    app.on_shutdown.append(_close_streams)
    app.on_response_prepare.append(_nosniff)
    probes.add_routes(app)
    openapi.add_routes(app)
    # Jobs first: its facade opens first, and inference's and searches' submit through it.
    jobs.add_routes(app)
    deployments.add_routes(app)
    inference.add_routes(app)
    logs.add_routes(app)
    metrics.add_routes(app)
    models.add_routes(app)
    nodes.add_routes(app)
    pending.add_routes(app)
    scheduling.add_routes(app)
    searches.add_routes(app)
    scrape.add_routes(app)
    tenants.add_routes(app)
    ui.add_routes(app)
    webhooks.add_routes(app)
    return app


async def _nosniff(_: web.Request, response: web.StreamResponse) -> None:
    """Every answer is what its Content-Type says: a browser holding the dashboard's cookie
    never runs a tenant's log text (text/plain) as a script or a page."""
    response.headers.setdefault("X-Content-Type-Options", "nosniff")


async def _database(
    app: web.Application,
    *,
    poll_interval: float,
    relay: RelayConfig | None,
    only: Sequence[Projection] | None,
    artifacts: ArtifactStore,
    log_retention_s: float,
    log_indexers: int,
    pending_apart: bool,
) -> AsyncIterator[None]:
    """The composition root's parts, under the keys the handlers read them by."""
    async with opened(
        app[DATABASE_URL],
        poll_interval=poll_interval,
        relay=relay,
        only=only,
        artifacts=artifacts,
        roots=app[LOCATION_ROOTS],
        log_retention_s=log_retention_s,
        log_indexers=log_indexers,
        pending_apart=pending_apart,
    ) as plane:
        app[PLANE] = plane
        app[POOL] = plane.pool
        app[STORE] = plane.store
        app[PROJECTIONS] = plane.projections
        app[HUB] = plane.hub
        app[JOBS] = plane.jobs
        app[MODELS] = plane.models
        app[DEPLOYMENTS] = plane.deployments
        app[INFERENCE] = plane.inference
        app[TASKS] = plane.tasks
        app[GAUGES] = plane.gauges
        app[WEBHOOKS] = plane.webhooks
        app[PRINCIPALS] = plane.principals
        yield


async def _background(app: web.Application) -> AsyncIterator[None]:
    """The control plane's background workers, while the application runs."""
    async with running(app[PLANE]) as task:
        app[BACKGROUND] = task
        yield


async def _close_streams(app: web.Application) -> None:
    app[HUB].stop()
    app[TASKS].stop()
