"""OpenTelemetry for a Trainyard process (`serve`, `agent`, `up`): one tracer provider and one
meter provider, installed once as OpenTelemetry's global ones.

Metrics are always kept for `GET /metrics` (rendered as Prometheus text); with
`OTEL_EXPORTER_OTLP_ENDPOINT` set, spans and metrics are also exported there with OTLP over
HTTP (the exporters read the other `OTEL_EXPORTER_OTLP_*` variables, and the metric reader
`OTEL_METRIC_EXPORT_INTERVAL`, themselves). Spans are recorded either way: their trace context
travels in every event's metadata, which ties a job's steps together across processes.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from controlplane.prometheus import render

OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"


@dataclass(frozen=True, slots=True)
class Telemetry:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    scraped: InMemoryMetricReader
    """The reader behind `/metrics`: cumulative, collected on each scrape."""

    def prometheus_text(self) -> str:
        """Every metric now, in the Prometheus text format. Runs the observable instruments'
        callbacks (NVML queries among them), so call it off the event loop."""
        return render(self.scraped.get_metrics_data())


def build(service: str) -> Telemetry:
    """Providers for a process named `service` (unless OTEL_SERVICE_NAME names it), exporting
    with OTLP when the environment names an endpoint; not installed anywhere."""
    resource = Resource.create({SERVICE_NAME: os.environ.get(SERVICE_NAME_ENV) or service})
    # Both providers flush and shut down when the process exits.
    tracer_provider = TracerProvider(resource=resource)
    scraped = InMemoryMetricReader()
    readers: list[MetricReader] = [scraped]
    if os.environ.get(OTLP_ENDPOINT_ENV):
        # Imported only when used: they bring protobuf and requests, which every CLI command
        # would otherwise load.
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    return Telemetry(tracer_provider, meter_provider, scraped)


_installed: Telemetry | None = None
_lock = threading.Lock()


def setup(service: str = "trainyard") -> Telemetry:
    """The process's telemetry, installed on the first call as OpenTelemetry's global
    providers; later calls return it (the global providers can be set only once)."""
    global _installed
    with _lock:
        if _installed is None:
            _installed = build(service)
            trace.set_tracer_provider(_installed.tracer_provider)
            metrics.set_meter_provider(_installed.meter_provider)
        return _installed
