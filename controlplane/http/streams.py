"""Live SSE streams, counted per tenant and in all on this control plane, so that no tenant
holds what all share (each stream holds a connection, and reads the database while it lives).

Every SSE route opens its stream through `live_stream` before it sends its headers: past the
tenant's `streams` limit, or the server's `TRAINYARD_MAX_STREAMS`, the request is a 429 with
Retry-After instead. The counts are this process's own: behind N replicas a tenant may hold N
times its limit in all, and each replica stays within its own.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from aiohttp import web

from controlplane.http.auth import principal
from controlplane.http.errors import error
from controlplane.http.keys import POOL
from controlplane.instruments import LIMIT_REFUSALS
from controlplane.tenants.views import tenant_limits

MAX_STREAMS_ENV = "TRAINYARD_MAX_STREAMS"
DEFAULT_MAX_STREAMS = 1000
RETRY_AFTER_S = 10.0
"""What a refused client is told to wait: streams end when their jobs do or clients leave."""


class LiveStreams:
    def __init__(self, most: int) -> None:
        self.most = most
        self._total = 0
        self._per_tenant: Counter[str] = Counter()

    @contextmanager
    def hold(self, tenant: str | None, tenant_most: int) -> Iterator[None]:
        """Count one stream of `tenant` (None: the admin's, counted in all only) while the
        block runs; web.HTTPTooManyRequests instead when a limit is reached."""
        if self._total >= self.most:
            LIMIT_REFUSALS.add(1, {"limit": "max_streams", "tenant": tenant or ""})
            raise error(
                429,
                f"this control plane serves at most {self.most} live streams at once "
                f"({MAX_STREAMS_ENV}); retry later",
                retry_after_s=RETRY_AFTER_S,
            )
        if tenant is not None and self._per_tenant[tenant] >= tenant_most:
            LIMIT_REFUSALS.add(1, {"limit": "streams", "tenant": tenant})
            raise error(
                429,
                f"tenant {tenant!r} holds {self._per_tenant[tenant]} live streams, its limit is "
                f"{tenant_most}; close one, or retry later",
                field="streams",
                retry_after_s=RETRY_AFTER_S,
            )
        self._total += 1
        if tenant is not None:
            self._per_tenant[tenant] += 1
        try:
            yield
        finally:
            self._total -= 1
            if tenant is not None:
                self._per_tenant[tenant] -= 1
                if not self._per_tenant[tenant]:
                    del self._per_tenant[tenant]


async def live_stream(request: web.Request) -> AbstractContextManager[None]:
    """One live stream of the request's principal, to enter before preparing the response and
    keep entered while the stream lives; entering it past a limit raises the 429."""
    tenant = principal(request).tenant
    most = 0
    if tenant is not None:
        limits = await tenant_limits(request.app[POOL], tenant)
        if limits is None:
            # Tenants are never removed, so a tenant's token always finds its row.
            raise RuntimeError(f"tenant {tenant!r} has a token but no row")
        most = limits.streams
    return request.app[STREAMS].hold(tenant, most)


STREAMS = web.AppKey("live_streams", LiveStreams)

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    # A proxy that buffers (nginx) would hold the events back.
    "X-Accel-Buffering": "no",
}
"""What every SSE response says of itself."""
SSE_EVENT: dict[str, Any] = {
    "schema": {
        "type": "object",
        "description": "one event: its type, its data (JSON), and, where it resumes, its id",
        "properties": {
            "event": {"type": "string"},
            "data": {"type": "string", "contentMediaType": "application/json"},
            "id": {"type": "string"},
        },
        "required": ["event", "data"],
    }
}
"""The OpenAPI media type object of an SSE response: its schema describes each event, as
OpenAPI 3.2's `itemSchema` does and tools read a 3.1 document (a string would say the events
are text, and their JSON data a disagreement)."""


def max_streams_from_env() -> int:
    """The server-wide limit from TRAINYARD_MAX_STREAMS (default 1000); ValueError, saying
    what is wrong, for anything but a whole number of 1 or more."""
    raw = os.environ.get(MAX_STREAMS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_STREAMS
    try:
        most = int(raw)
    except ValueError:
        most = 0
    if most < 1:
        raise ValueError(f"{MAX_STREAMS_ENV} must be a whole number, 1 or more, not {raw!r}")
    return most
