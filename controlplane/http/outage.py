"""A request that meets the database gone (a failover under way, the server restarting) is
answered 503 with Retry-After, never a 500: nothing it did was committed, so a retry is safe
(with its Idempotency-Key where it submits), and Patroni names a new primary within seconds."""

from __future__ import annotations

import logging

import asyncpg
from aiohttp import web
from aiohttp.typedefs import Handler

from controlplane.database import DatabaseUnavailable
from controlplane.http.errors import error

log = logging.getLogger(__name__)

RETRY_AFTER_S = 2.0
"""About a failover's time: the API came back within 3 s of a kill -9 of the primary
(docs/failover.md)."""
LOST = (
    ConnectionError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    DatabaseUnavailable,
)
"""What a lost, refused or demoted database connection raises, unlike a handler's own error. A
read-only transaction is a connection that reached a primary just demoted to standby."""


@web.middleware
async def outage_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except LOST as exc:
        log.warning("%s %s: the database is unavailable (%s)", request.method, request.path, exc)
        raise error(
            503,
            "the database is unavailable for a moment (a failover or a restart); nothing was "
            "changed: retry after the Retry-After seconds",
            retry_after_s=RETRY_AFTER_S,
        ) from exc
