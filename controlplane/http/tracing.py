"""A server span for every API request, continuing the caller's trace (a `traceparent`
header) when it sends one. A job submitted in a request gets that request's trace."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode

from controlplane.jobs.tracing import tracer

UNTRACED = frozenset({"/healthz", "/readyz"})
"""Probes, polled every few seconds by load balancers: a trace of each would bury the rest."""


@web.middleware
async def tracing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in UNTRACED:
        return await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else None
    attributes = {"http.request.method": request.method, "url.path": request.path}
    if route is not None:
        attributes["http.route"] = route
    with tracer.start_as_current_span(
        f"{request.method} {route}" if route else request.method,
        context=propagate.extract(request.headers),
        kind=SpanKind.SERVER,
        attributes=attributes,
        # Refusals (4xx) are answers, not failures of the server: status is set below.
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            span.set_attribute("http.response.status_code", exc.status)
            raise
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        span.set_attribute("http.response.status_code", response.status)
        return response
