"""The control plane's HTTP server from the command line: start, bootstrap, listen, stop cleanly."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from controlplane.database import describe
from controlplane.failures import CommandFailed
from controlplane.heap import freeze_startup_heap
from controlplane.http.app import create_app
from controlplane.http.keys import PLANE, PROJECTIONS, STORE
from controlplane.http.streams import max_streams_from_env
from controlplane.jobs.images import ImageAllowlist
from controlplane.jobs.locations import Roots
from controlplane.logs.indexer import log_indexers_from_env
from controlplane.settings import (
    ADMIN_TOKEN_FILE,
    DAY_S,
    LOG_RETENTION_ENV,
    LOG_RETENTION_S,
    log_retention_days,
)
from controlplane.tenants.admin import bootstrap_admin_token
from controlplane.webhooks.addresses import ALLOW_NETWORKS_ENV, parse_networks
from controlplane.webhooks.relay import RelayConfig

log = logging.getLogger(__name__)

APART_S = 30.0
"""How long a starting replica waits for its other processes before it listens without them."""
MAX_REQUEST_LINE = 32 * 1024
"""The longest request line served: a model search's 1000 characters take up to 12 bytes each
once percent-encoded (4-byte UTF-8), past aiohttp's default of 8190, which it refuses with a
bare text/plain 400 before any handler could name the parameter."""


class ServeError(CommandFailed):
    """The control plane cannot start; the message is one line for the operator."""


def allowed_images() -> ImageAllowlist:
    """`TRAINYARD_IMAGES`; ServeError naming it when it is malformed."""
    try:
        return ImageAllowlist.from_env(os.environ)
    except ValueError as exc:
        raise ServeError(str(exc)) from None


def log_retention_s(days: float | None) -> float:
    """Seconds a job's log lines are kept after it ended (0: forever): `days` (the flag
    `--log-retention-days`), else TRAINYARD_LOG_RETENTION_DAYS, else LOG_RETENTION_S; ServeError
    naming the variable when it is malformed."""
    if days is None:
        raw = os.environ.get(LOG_RETENTION_ENV, "").strip()
        if not raw:
            return LOG_RETENTION_S
        try:
            days = log_retention_days(raw)
        except ValueError as exc:
            raise ServeError(f"{LOG_RETENTION_ENV}: {exc}") from None
    return days * DAY_S


def signalled() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


@asynccontextmanager
async def listening(
    url: str, host: str, port: int, home: Path, images: ImageAllowlist, log_retention_s: float
) -> AsyncIterator[web.Application]:
    """The control plane listening on host:port until the block ends; then a graceful
    shutdown (open SSE streams closed, in-flight requests finished, background tasks stopped).
    `log_retention_s`: how long after a job ended its log lines go (0: never).
    """
    try:
        allowed = parse_networks(os.environ.get(ALLOW_NETWORKS_ENV, ""))
        max_streams = max_streams_from_env()
        roots = Roots.from_env()
        log_indexers = log_indexers_from_env()
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    app = create_app(
        url,
        images=images,
        roots=roots,
        relay=RelayConfig(allow_networks=allowed),
        max_streams=max_streams,
        log_retention_s=log_retention_s,
        log_indexers=log_indexers,
        pending_apart=True,
    )
    runner = web.AppRunner(app, handle_signals=False, max_line_size=MAX_REQUEST_LINE)
    await runner.setup()
    try:
        try:
            token = await bootstrap_admin_token(app[STORE], app[PROJECTIONS], home)
        except OSError as exc:
            raise ServeError(f"cannot write the admin token under {home}: {exc}") from exc
        if token is not None:
            # Only where it is: stdout ends up in journals and `docker logs`, kept and read
            # far more widely than the file (mode 0600) is.
            path = home / ADMIN_TOKEN_FILE
            print(f"admin token issued, in {path} (mode 0600): use it with --token-file {path}")
        # Its processes too: their start (an interpreter's imports, connections) took the CPU
        # from the first requests. Not for ever: one that does not start is started again by
        # its supervisor, which says why, and the replica answers meanwhile.
        try:
            async with asyncio.timeout(APART_S):
                await app[PLANE].apart()
        except TimeoutError:
            log.warning("the control plane's other processes are not up after %g s", APART_S)
        # Started (the app's parts, its background tasks, the admin token), not yet listening:
        # the one full collection this costs holds no request up.
        freeze_startup_heap()
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
        print(f"control plane on http://{host}:{port} (database {describe(url)})")
        print(f"dashboard on http://{host}:{port}/ui/ (sign in with a token)")
        yield app
        print("shutting down")
    finally:
        await runner.cleanup()
