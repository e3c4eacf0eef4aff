"""The control plane's aiohttp application and the background tasks that live with it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from controlplane.database import create_pool
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.http.openapi import document
from controlplane.projections.catalog import all_projections
from controlplane.projections.runner import ProjectionRunner

log = logging.getLogger(__name__)

DATABASE_URL = web.AppKey("database_url", str)
POOL = web.AppKey("pool", asyncpg.Pool)
STORE = web.AppKey("store", EventStore)
LISTENER = web.AppKey("listener", LogListener)
PROJECTIONS = web.AppKey("projections", ProjectionRunner)
BACKGROUND = web.AppKey("background", asyncio.Task[None])


def create_app(database_url: str, *, poll_interval: float = 1.0) -> web.Application:
    app = web.Application()
    app[DATABASE_URL] = database_url
    app[LISTENER] = LogListener(database_url, poll_interval=poll_interval)
    app.cleanup_ctx.append(_database)
    app.cleanup_ctx.append(_background)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", openapi)
    return app


async def _database(app: web.Application) -> AsyncIterator[None]:
    app[POOL] = pool = await create_pool(app[DATABASE_URL])
    app[STORE] = store = EventStore(pool)
    app[PROJECTIONS] = ProjectionRunner(pool, store, app[LISTENER], all_projections())
    yield
    await store.close()
    await pool.close()


async def _background(app: web.Application) -> AsyncIterator[None]:
    """The log listener and the projection runner, siblings that stop together."""
    listener, projections = app[LISTENER], app[PROJECTIONS]

    async def supervise() -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(listener.run(), name="log-listener")
                group.create_task(projections.run(), name="projection-runner")
        except Exception:
            # The server keeps answering, but /readyz now says "not ready", so a load
            # balancer or supervisor takes this replica out of service.
            log.exception("a background task of the control plane failed")
            raise

    app[BACKGROUND] = task = asyncio.create_task(supervise(), name="control-plane-background")
    yield
    listener.stop()
    projections.stop()
    if not task.done():
        # Both loops see their stop flag within one poll interval.
        await asyncio.wait({task}, timeout=10)
    if not task.done():
        task.cancel()


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    app = request.app
    try:
        await app[POOL].fetchval("SELECT 1")
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
