"""The control plane's aiohttp application and the background tasks that live with it."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from controlplane.agents.manager import LifecycleManager
from controlplane.cluster_gauges import ClusterGauges
from controlplane.database import create_pool
from controlplane.events.hub import StreamHub
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.http import jobs, logs, metrics, nodes, scrape, tenants, webhooks
from controlplane.http.auth import auth_middleware
from controlplane.http.keys import (
    BACKGROUND,
    DATABASE_URL,
    GAUGES,
    HUB,
    IMAGES,
    JOBS,
    LISTENER,
    LOCATION_ROOTS,
    MANAGER,
    POOL,
    PROJECTIONS,
    SSE_HEARTBEAT_S,
    STORE,
    SUBMISSIONS,
    WEBHOOK_CONFIG,
    WEBHOOKS,
)
from controlplane.http.openapi import document
from controlplane.http.streams import DEFAULT_MAX_STREAMS, STREAMS, LiveStreams
from controlplane.http.tracing import tracing_middleware
from controlplane.jobs.images import ImageAllowlist
from controlplane.jobs.locations import Roots
from controlplane.jobs.service import Jobs
from controlplane.projections.catalog import all_projections
from controlplane.projections.runner import ProjectionRunner
from controlplane.queries import Q
from controlplane.tenants.submissions import SubmissionRates
from controlplane.webhooks.relay import RelayConfig, WebhookRelay

log = logging.getLogger(__name__)


def create_app(
    database_url: str,
    *,
    poll_interval: float = 1.0,
    sse_heartbeat_s: float = 15.0,
    relay: RelayConfig | None = None,
    images: ImageAllowlist | None = None,
    roots: Roots | None = None,
    max_streams: int = DEFAULT_MAX_STREAMS,
) -> web.Application:
    """The application; `images` None: the allowlist `TRAINYARD_IMAGES` sets (ValueError when
    it is malformed), or the default; `roots`: where `file://` data and results may be
    (default: from the environment)."""
    app = web.Application(middlewares=[tracing_middleware, auth_middleware])
    app[DATABASE_URL] = database_url
    app[IMAGES] = ImageAllowlist.from_env(os.environ) if images is None else images
    app[WEBHOOK_CONFIG] = relay or RelayConfig()
    app[LISTENER] = LogListener(database_url, poll_interval=poll_interval)
    app[SSE_HEARTBEAT_S] = sse_heartbeat_s
    app[LOCATION_ROOTS] = roots if roots is not None else Roots.from_env()
    app[SUBMISSIONS] = SubmissionRates()
    app[STREAMS] = LiveStreams(max_streams)
    app.cleanup_ctx.append(_database)
    app.cleanup_ctx.append(_background)
    # Open SSE streams end first, so that shutdown does not wait for their clients.
    app.on_shutdown.append(_close_streams)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", openapi)
    jobs.add_routes(app)
    logs.add_routes(app)
    metrics.add_routes(app)
    nodes.add_routes(app)
    scrape.add_routes(app)
    tenants.add_routes(app)
    webhooks.add_routes(app)
    return app


async def _database(app: web.Application) -> AsyncIterator[None]:
    app[POOL] = pool = await create_pool(app[DATABASE_URL])
    app[STORE] = store = EventStore(pool)
    app[PROJECTIONS] = ProjectionRunner(pool, store, app[LISTENER], all_projections())
    app[HUB] = StreamHub(store, app[LISTENER])
    app[JOBS] = Jobs(store)
    app[MANAGER] = LifecycleManager(app[DATABASE_URL], pool, store)
    app[GAUGES] = ClusterGauges(pool)
    app[WEBHOOKS] = WebhookRelay(app[DATABASE_URL], pool, store, app[WEBHOOK_CONFIG])
    yield
    await app[WEBHOOKS].close()
    await store.close()
    await pool.close()


async def _background(app: web.Application) -> AsyncIterator[None]:
    """The log listener, the projection runner, the SSE hub, the lifecycle manager and the
    cluster gauges and webhook relay: siblings that stop together."""
    listener, projections, hub, manager = app[LISTENER], app[PROJECTIONS], app[HUB], app[MANAGER]
    gauges, relay = app[GAUGES], app[WEBHOOKS]

    async def supervise() -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(listener.run(), name="log-listener")
                group.create_task(projections.run(), name="projection-runner")
                group.create_task(hub.run(), name="sse-hub")
                group.create_task(manager.run(), name="lifecycle-manager")
                group.create_task(gauges.run(), name="cluster-gauges")
                group.create_task(relay.run(), name="webhook-relay")
        except Exception:
            # The server keeps answering, but /readyz now says "not ready", so a load
            # balancer or supervisor takes this replica out of service.
            log.exception("a background task of the control plane failed")
            raise

    app[BACKGROUND] = task = asyncio.create_task(supervise(), name="control-plane-background")
    yield
    hub.stop()
    manager.stop()
    gauges.stop()
    relay.stop()
    listener.stop()
    projections.stop()
    listener.wake()  # the runner and the hub wait on the listener: let them see their flags
    await asyncio.wait({task}, timeout=10)
    if not task.done():
        task.cancel()
    # Retrieve the outcome (already logged by `supervise`) before the pool closes.
    await asyncio.gather(task, return_exceptions=True)


async def _close_streams(app: web.Application) -> None:
    app[HUB].stop()


async def healthz(request: web.Request) -> web.Response:
    """Alive unless the background tasks have died: then a supervisor should restart us."""
    if request.app[BACKGROUND].done():
        return web.json_response({"status": "background tasks stopped"}, status=503)
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    app = request.app
    try:
        await app[POOL].fetchval(Q["ping"])
        database = True
        caught_up = await app[PROJECTIONS].caught_up()
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        database = caught_up = False
    background = not app[BACKGROUND].done()
    ready = database and caught_up and background
    body = {
        "status": "ready" if ready else "not ready",
        "database": database,
        "projections_caught_up": caught_up,
        "background_tasks": background,
    }
    return web.json_response(body, status=200 if ready else 503)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document())
