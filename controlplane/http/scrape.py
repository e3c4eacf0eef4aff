"""`GET /metrics`: the process's metrics in the Prometheus text format, for the admin (the
labels name tenants and jobs). Cluster gauges are sampled first, so a scrape is current."""

from __future__ import annotations

import asyncio

from aiohttp import web

from controlplane import telemetry
from controlplane.http.auth import principal
from controlplane.http.errors import error
from controlplane.http.keys import GAUGES
from controlplane.http.operations import Answer, Operation, add_operations
from controlplane.prometheus import CONTENT_TYPE


async def scrape(request: web.Request) -> web.Response:
    if not principal(request).is_admin:
        raise error(403, "only the admin token may read /metrics")
    await request.app[GAUGES].sample()
    # Collecting runs the observable gauges' callbacks, NVML queries among them.
    text = await asyncio.to_thread(telemetry.setup().prometheus_text)
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})


OPERATIONS = (
    Operation(
        "get",
        "/metrics",
        scrape,
        "scrapeMetrics",
        "Metrics in the Prometheus text format (admin token only)",
        {200: Answer("Prometheus text format 0.0.4", {"type": "string"}, media="text/plain")},
        {401: "missing or wrong token", 403: "not the admin token"},
        description="Queue depth, claim latency, events appended, SSE clients, log lines "
        "stored, GPUs offered and allocated, and GPU utilization per job; the "
        "docs/operations.md (Traces and metrics) lists every name. Agents running in this "
        "process report here too; separate agents export with OTLP.",
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
