"""OpenTelemetry: a job's steps are spans of one trace, from the API request through its events
to the agent's claim and learners; `/metrics` is Prometheus text with the cluster's metrics;
OTLP export reaches a collector when an endpoint is set."""

from __future__ import annotations

import asyncio
import re
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane import telemetry
from controlplane.agents.claims import claim
from controlplane.agents.lost_nodes import LostNodes
from controlplane.events.store import EventStore
from controlplane.http.app import create_app
from controlplane.jobs.lifecycle import JobStatus
from controlplane.prometheus import CONTENT_TYPE, render
from controlplane.tenants.admin import bootstrap_admin_token
from controlplane.tenants.service import issue_token, set_limits
from tests.cluster import Plane, RunningAgent
from tests.controlplane.agents.test_claims import Cluster, manifest
from tests.polling import eventually

Client = TestClient[web.Request, web.Application]

PRINT = [sys.executable, "-c", "print('hello from the learner')"]
# Prints, then runs until cancelled: its GPU, its log line and its SSE stream are live.
WORK = [sys.executable, "-c", "import time; print('working', flush=True); time.sleep(60)"]

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r'(?:\{(?P<labels>[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)\})?'
    r" (?P<value>[-+]?(?:[0-9.]+(?:e[-+]?[0-9]+)?|Inf|NaN))$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """Every span this process finishes from now on (the providers are global, set once)."""
    exporter = InMemorySpanExporter()
    telemetry.setup("tests").tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


@pytest.fixture
async def client(plane: Plane) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(plane.url, poll_interval=0.2))) as client:
        yield client


@pytest.fixture
async def headers(plane: Plane) -> dict[str, str]:
    """A token of tenant acme."""
    token = await issue_token(plane.store, plane.runner, "acme", actor="test")
    return {"Authorization": f"Bearer {token.plaintext}"}


async def submit(client: Client, headers: dict[str, str], command: list[str]) -> uuid.UUID:
    manifest = {"name": "t", "image": "img", "command": command, "gpus_per_learner": 1}
    response = await client.post("/v1/jobs", json=manifest, headers=headers)
    assert response.status == 201, await response.text()
    return uuid.UUID((await response.json())["id"])


def parse_prometheus(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Samples by name and labels; fails on any line that is not valid text format 0.0.4."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    typed: set[str] = set()
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in {"counter", "gauge", "histogram"}, line
            assert name not in typed, f"{name} typed twice"
            typed.add(name)
            continue
        match = _SAMPLE.match(line)
        assert match is not None, f"not a valid sample line: {line!r}"
        family = re.sub(r"_(bucket|sum|count)$", "", match["name"])
        assert match["name"] in typed or family in typed, f"{line!r} has no TYPE"
        labels = frozenset(_LABEL.findall(match["labels"] or ""))
        samples[(match["name"], labels)] = float(match["value"])
    return samples


def series(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> list[float]:
    """The values of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return [v for (n, ls), v in samples.items() if n == name and wanted <= ls]


def of_trace(spans: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    return [
        span
        for span in spans.get_finished_spans()
        if span.context is not None and span.context.trace_id == trace_id
    ]


async def test_a_jobs_spans_from_the_api_to_its_claim_and_learners_share_one_trace(
    spans: InMemorySpanExporter,
    plane: Plane,
    agent: RunningAgent,
    client: Client,
    headers: dict[str, str],
) -> None:
    job_id = await submit(client, headers, PRINT)
    await plane.state(job_id, JobStatus.COMPLETED)

    def named(name: str) -> list[ReadableSpan]:
        return [
            span
            for span in spans.get_finished_spans()
            if span.name == name and span.attributes.get("trainyard.job.id") == str(job_id)
        ]

    async def attempt_ended() -> bool:
        return bool(named("job.attempt"))

    # The attempt's span ends just after the job's last event: wait for it.
    await eventually(attempt_ended)
    [submitted] = named("job.submit")
    assert submitted.context is not None and submitted.parent is not None
    trace_id = submitted.context.trace_id
    in_trace = of_trace(spans, trace_id)
    by_name = {span.name: span for span in in_trace}
    request = by_name["POST /v1/jobs"]
    assert request.context is not None and request.parent is None
    assert submitted.parent.span_id == request.context.span_id
    [claim] = named("job.claim")
    assert claim.parent is not None and claim.parent.span_id == submitted.context.span_id
    assert claim.attributes["trainyard.node"] == "n1"
    [attempt] = named("job.attempt")
    assert claim.context is not None and attempt.parent is not None
    assert attempt.parent.span_id == claim.context.span_id
    starts = [span for span in in_trace if span.name == "learner.start"]
    assert len(starts) == 1
    assert attempt.context is not None and starts[0].parent is not None
    assert starts[0].parent.span_id == attempt.context.span_id
    # The later steps, from the learner's reports to the end, are children of the attempt.
    for step in ("job.enter_phase", "job.complete"):
        parent = by_name[step].parent
        assert parent is not None and parent.span_id == attempt.context.span_id


async def test_a_cancel_request_is_a_step_of_the_jobs_trace_linked_to_the_request(
    spans: InMemorySpanExporter,
    plane: Plane,
    agent: RunningAgent,
    client: Client,
    headers: dict[str, str],
) -> None:
    job_id = await submit(client, headers, WORK)
    await plane.state(job_id, JobStatus.PROCESSING)
    response = await client.post(f"/v1/jobs/{job_id}/cancel", headers=headers)
    assert response.status == 200
    await plane.state(job_id, JobStatus.CANCELLED)
    finished = spans.get_finished_spans()
    [submitted] = [s for s in finished if s.name == "job.submit" and _job(s) == str(job_id)]
    [cancel] = [s for s in finished if s.name == "job.cancel" and _job(s) == str(job_id)]
    [request] = [s for s in finished if s.name == "POST /v1/jobs/{job_id}/cancel"]
    assert submitted.context is not None and cancel.context is not None
    assert request.context is not None
    assert cancel.context.trace_id == submitted.context.trace_id
    assert request.context.trace_id != submitted.context.trace_id
    assert [link.context.span_id for link in cancel.links] == [request.context.span_id]


def _job(span: ReadableSpan) -> Any:
    return (span.attributes or {}).get("trainyard.job.id")


async def test_a_lost_nodes_restart_and_the_next_claim_are_spans_of_the_jobs_trace(
    spans: InMemorySpanExporter,
    pool: asyncpg.Pool,
    store: EventStore,
    db_url: str,
    owner: asyncpg.Connection,
) -> None:
    cluster = Cluster(pool, store, db_url)
    await cluster.tenant("acme")
    await cluster.node("n1", 1)
    await cluster.node("n2", 1)
    job_id = await cluster.submit("acme", manifest(1))
    await cluster.project()
    assert len(await claim(pool, store, "n1")) == 1
    await owner.execute("UPDATE nodes SET lease_until = now() - interval '1 second'")
    await owner.execute(
        "UPDATE nodes SET lease_until = now() + interval '1 hour' WHERE name = 'n2'"
    )
    assert await LostNodes(pool, store).declare_expired() == ["n1"]

    async def requeued() -> bool:
        # The restart may not be readable at once (an older transaction open elsewhere on the
        # server holds the log's newest events back): the queue is waited for, not assumed.
        await cluster.project()
        query = "SELECT attempt FROM job_status WHERE job_id = $1 AND state = 'QUEUED'"
        return await pool.fetchval(query, job_id) == 2

    await eventually(requeued)
    [again] = await claim(pool, store, "n2")
    assert again.attempt == 2

    mine = [s for s in spans.get_finished_spans() if _job(s) == str(job_id)]
    [submitted] = [s for s in mine if s.name == "job.submit"]
    assert submitted.context is not None
    steps = [(s.name, s.attributes.get("trainyard.node")) for s in mine if s.name != "job.submit"]
    assert steps == [("job.claim", "n1"), ("job.restart", "n1"), ("job.claim", "n2")]
    for span in mine:
        assert span.context is not None and span.context.trace_id == submitted.context.trace_id
    # The restart and the claims are steps of the job, children of its root.
    assert {s.parent.span_id for s in mine if s.parent} == {submitted.context.span_id}
    restarted = [e for e in await store.read_stream(f"job-{job_id}") if e.stream_version == 3]
    assert restarted[0].metadata.trace["traceparent"].split("-")[1] == (
        f"{submitted.context.trace_id:032x}"
    )


async def test_metrics_are_prometheus_text_with_the_clusters_figures(
    spans: InMemorySpanExporter,
    plane: Plane,
    agent: RunningAgent,
    client: Client,
    headers: dict[str, str],
    tmp_path: Path,
) -> None:
    admin = await bootstrap_admin_token(plane.store, plane.runner, tmp_path)
    assert admin is not None
    done = await submit(client, headers, PRINT)
    await plane.state(done, JobStatus.COMPLETED)
    working = await submit(client, headers, WORK)
    await plane.state(working, JobStatus.PROCESSING)
    await eventually(lambda: _has_line(plane, working))
    # An SSE client watching the running job while the metrics are read.
    watching = await client.get(f"/v1/jobs/{working}/events", headers=headers)
    await watching.content.readuntil(b"\n\n")

    assert (await client.get("/metrics", headers=headers)).status == 403
    assert (await client.get("/metrics")).status == 401
    response = await client.get("/metrics", headers={"Authorization": f"Bearer {admin}"})
    assert response.status == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE
    samples = parse_prometheus(await response.text())
    watching.close()

    assert series(samples, "trainyard_queue_depth", tenant="acme") == [0]
    assert series(samples, "trainyard_gpus", node="n1") == [2]
    assert series(samples, "trainyard_gpus_allocated", tenant="acme", node="n1") == [1]
    [claims] = series(samples, "trainyard_claim_latency_seconds_count", tenant="acme")
    assert claims >= 2
    [within] = series(samples, "trainyard_claim_latency_seconds_bucket", tenant="acme", le="+Inf")
    assert within == claims
    [latency] = series(samples, "trainyard_claim_latency_seconds_sum", tenant="acme")
    assert 0 <= latency < 60 * claims
    assert series(samples, "trainyard_events_appended_total", type="JobSubmitted")[0] >= 2
    assert series(samples, "trainyard_events_appended_total", type="JobCompleted")[0] >= 1
    assert series(samples, "trainyard_sse_clients", stream="events")[0] >= 1
    assert series(samples, "trainyard_log_lines_total")[0] >= 2
    # Fake GPUs report 0%; the series exists only for the running job's one GPU.
    assert series(samples, "trainyard_gpu_utilization_percent", job=str(working)) == [0]
    assert series(samples, "trainyard_gpu_utilization_percent", job=str(done)) == []


async def test_requests_refused_at_a_limit_are_counted_per_limit_and_tenant(
    spans: InMemorySpanExporter,
    plane: Plane,
    client: Client,
    headers: dict[str, str],
    tmp_path: Path,
) -> None:
    admin = await bootstrap_admin_token(plane.store, plane.runner, tmp_path)
    assert admin is not None
    limits = {"submissions_per_s": 0.01, "submission_burst": 1}
    await set_limits(plane.store, plane.runner, "acme", limits, actor="test")
    manifest = {"name": "t", "image": "img", "command": ["x"]}

    async def refused() -> float:
        # The counter lives as long as the process: other tests' refusals count in it too.
        response = await client.get("/metrics", headers={"Authorization": f"Bearer {admin}"})
        samples = parse_prometheus(await response.text())
        found = series(
            samples, "trainyard_limits_refused_total", limit="submissions_per_s", tenant="acme"
        )
        assert len(found) <= 1
        return sum(found)

    before = await refused()
    assert (await client.post("/v1/jobs", json=manifest, headers=headers)).status == 201
    for _ in range(2):
        assert (await client.post("/v1/jobs", json=manifest, headers=headers)).status == 429
    assert await refused() - before == 2


async def _has_line(plane: Plane, job_id: uuid.UUID) -> bool:
    return "working" in await plane.log_text(job_id)


def test_prometheus_text_names_counters_histograms_and_escapes_labels() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    meter.create_counter("a.count", unit="{thing}", description="Things.").add(3, {"k": 'x"y\n'})
    histogram = meter.create_histogram(
        "a.wait", unit="s", explicit_bucket_boundaries_advisory=[1, 10]
    )
    for value in (0.5, 2, 20):
        histogram.record(value, {"tenant": "acme"})
    meter.create_up_down_counter("a.open").add(-1)
    text = render(reader.get_metrics_data())
    assert text.splitlines() == [
        "# HELP a_count_total Things.",
        "# TYPE a_count_total counter",
        'a_count_total{k="x\\"y\\n"} 3',
        "# HELP a_wait_seconds ",
        "# TYPE a_wait_seconds histogram",
        'a_wait_seconds_bucket{le="1",tenant="acme"} 1',
        'a_wait_seconds_bucket{le="10",tenant="acme"} 2',
        'a_wait_seconds_bucket{le="+Inf",tenant="acme"} 3',
        'a_wait_seconds_sum{tenant="acme"} 22.5',
        'a_wait_seconds_count{tenant="acme"} 3',
        "# HELP a_open ",
        "# TYPE a_open gauge",
        "a_open -1",
    ]
    parse_prometheus(text)


async def test_spans_and_metrics_go_to_the_otlp_endpoint_when_one_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    received: list[tuple[str, str]] = []

    async def collect(request: web.Request) -> web.Response:
        await request.read()
        received.append((request.path, request.headers["Content-Type"]))
        return web.Response(status=200)

    collector = web.Application()
    collector.router.add_post("/v1/traces", collect)
    collector.router.add_post("/v1/metrics", collect)
    async with TestServer(collector) as server:
        monkeypatch.setenv(telemetry.OTLP_ENDPOINT_ENV, str(server.make_url("")).rstrip("/"))
        built = telemetry.build("otlp-test")
        built.tracer_provider.get_tracer("t").start_span("exported").end()
        built.meter_provider.get_meter("t").create_counter("exported").add(1)
        # The exporters post synchronously: off the loop that serves the collector.
        await asyncio.to_thread(built.tracer_provider.shutdown)
        await asyncio.to_thread(built.meter_provider.shutdown)
    assert ("/v1/traces", "application/x-protobuf") in received
    assert ("/v1/metrics", "application/x-protobuf") in received
