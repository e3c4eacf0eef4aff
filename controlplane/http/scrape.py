"""`GET /metrics`: the process's metrics in the Prometheus text format, for the admin (the
labels name tenants and jobs). Cluster gauges are sampled first, so a scrape is current."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from controlplane import telemetry
from controlplane.http.auth import principal
from controlplane.http.errors import error
from controlplane.http.keys import GAUGES
from controlplane.prometheus import CONTENT_TYPE


def add_routes(app: web.Application) -> None:
    app.router.add_get("/metrics", scrape)


async def scrape(request: web.Request) -> web.Response:
    if not principal(request).is_admin:
        raise error(403, "only the admin token may read /metrics")
    await request.app[GAUGES].sample()
    # Collecting runs the observable gauges' callbacks, NVML queries among them.
    text = await asyncio.to_thread(telemetry.setup().prometheus_text)
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})


def openapi_paths() -> dict[str, Any]:
    return {
        "/metrics": {
            "get": {
                "operationId": "scrapeMetrics",
                "summary": "Metrics in the Prometheus text format (admin token only)",
                "description": "Queue depth, claim latency, events appended, SSE clients, log "
                "lines stored, GPUs offered and allocated, and GPU utilization per job; the "
                "docs/operations.md (Traces and metrics) lists every name. Agents running in "
                "this process report here too; "
                "separate agents export with OTLP.",
                "security": [{"bearer": []}],
                "responses": {
                    "200": {
                        "description": "Prometheus text format 0.0.4",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": {"description": "missing or wrong token"},
                    "403": {"description": "not the admin token"},
                },
            }
        }
    }
