"""Trainyard's metrics: every instrument, by the name it is exported under.

The instruments are OpenTelemetry's, created on the global meter; until `telemetry.setup()`
installs a provider they record nothing. docs/operations.md's "Traces and metrics" lists their
Prometheus names.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.util.types import Attributes

Reading = tuple[float, Attributes]
Source = Callable[[], Iterable[Reading]]
"""Called when metrics are collected (on any thread): the values to report now."""

_meter = metrics.get_meter("trainyard")


class ObservedGauge:
    """A gauge read when metrics are collected, from sources registered while they live (a
    control plane's cluster sampler, an agent's running learners); several may report at once."""

    def __init__(self, name: str, unit: str, description: str) -> None:
        self._sources: list[Source] = []
        self._lock = threading.Lock()
        _meter.create_observable_gauge(
            name, callbacks=[self._observe], unit=unit, description=description
        )

    @contextlib.contextmanager
    def source(self, source: Source) -> Iterator[None]:
        with self._lock:
            self._sources.append(source)
        try:
            yield
        finally:
            with self._lock:
                self._sources.remove(source)

    def _observe(self, options: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            sources = list(self._sources)
        for source in sources:
            for value, attributes in source():
                yield Observation(value, attributes)


QUEUE_DEPTH = ObservedGauge(
    "trainyard.queue.depth",
    "{job}",
    "Jobs waiting in the queue (QUEUED, restart backoff included), per tenant.",
)
GPUS = ObservedGauge("trainyard.gpus", "{gpu}", "GPUs offered by READY nodes, per node.")
GPUS_ALLOCATED = ObservedGauge(
    "trainyard.gpus.allocated", "{gpu}", "GPUs allocated to job attempts, per tenant and node."
)
GPU_UTILIZATION = ObservedGauge(
    "trainyard.gpu.utilization",
    "%",
    "Percent of recent time a kernel ran on the GPU (NVML), per allocated GPU with its job.",
)

CLAIM_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
CLAIM_LATENCY = _meter.create_histogram(
    "trainyard.claim.latency",
    unit="s",
    description="From a job entering QUEUED (or the end of its restart backoff) to its claim.",
    explicit_bucket_boundaries_advisory=CLAIM_BUCKETS_S,
)
EVENTS_APPENDED = _meter.create_counter(
    "trainyard.events.appended",
    unit="{event}",
    description="Events appended to the event store by this process, per event type.",
)
SSE_CLIENTS = _meter.create_up_down_counter(
    "trainyard.sse.clients",
    unit="{client}",
    description="Open SSE streams, per kind (events, logs, tasks).",
)
LIMIT_REFUSALS = _meter.create_counter(
    "trainyard.limits.refused",
    unit="{request}",
    description="Requests refused at a limit, per limit (streams, max_streams, "
    "submissions_per_s, and each limit of the admission policy) and tenant (none for the "
    "admin's).",
)
PROJECTIONS_STOPPED = _meter.create_up_down_counter(
    "trainyard.projections.stopped",
    unit="{projection}",
    description="Projections this process stopped on an event they failed on too many times in "
    "a row, per projection (1 until the process restarts).",
)
LOG_LINES = _meter.create_counter(
    "trainyard.log.lines",
    unit="{line}",
    description="Learner log lines stored by this process's log shipper.",
)


@contextlib.contextmanager
def sse_client(stream: str) -> Iterator[None]:
    """Counts an open SSE stream of kind `stream` while the block runs."""
    attributes = {"stream": stream}
    SSE_CLIENTS.add(1, attributes)
    try:
        yield
    finally:
        SSE_CLIENTS.add(-1, attributes)


SERVING_QUEUE_DEPTH = ObservedGauge(
    "trainyard.serving.queue.depth",
    "{task}",
    "Serving tasks waiting for a replica, per tenant and deployment.",
)
SERVING_BATCH_SIZE = ObservedGauge(
    "trainyard.serving.batch.size",
    "{item}",
    "Mean items per batch a deployment's replicas ran, over the batches kept (24 hours).",
)
SERVING_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60)
SERVING_REQUESTS = _meter.create_counter(
    "trainyard.serving.requests",
    unit="{request}",
    description="Predictions this process accepted, per tenant, deployment (or pipeline) and "
    "memo outcome (hit, miss, off).",
)
SERVING_LATENCY = _meter.create_histogram(
    "trainyard.serving.request.duration",
    unit="s",
    description="From a synchronous prediction's arrival to its answer with the result, per "
    "tenant and deployment (or pipeline).",
    explicit_bucket_boundaries_advisory=SERVING_BUCKETS_S,
)
WORKER_ITEM_FAILURES = _meter.create_counter(
    "trainyard.worker.item_failures",
    unit="{failure}",
    description="Steps of a background worker that failed on one item's data (a job, a "
    "deployment, a search, an inference job, a node) and were skipped while the worker went on "
    "with the others, per worker.",
)
