"""`trainyard bench registry`: the model repository's search against MLflow's model registry.

On a scratch database of the configured Postgres: `bench.model_repository_data` makes `models`
models of `versions` versions each with realistic metadata (over three tenants, every version
public, so that every tenant finds the same versions MLflow, which has no tenants, finds).
Trainyard's half publishes each through the Models service (artifact into a file store, event
appended: `publish_per_s`), waits for the `models` projection, then runs each search of `CASES`
`repeats` times as a tenant's `GET /v1/models?q=` does (`catalog.search`: the first page of 50,
the total and the facet counts), checking the total and the facets against the reference
evaluation every time. MLflow's half (`bench.model_repository_mlflow`, the `bench` extra) loads
the same versions into its registry on a scratch database of the same server and answers the
same questions the way its API lets a user; `ratio_vs_mlflow` is MLflow's p50 over ours. Without
MLflow installed, its half is left out and says so (`mlflow`: null).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from bench.model_repository_data import CASES, SearchCase, VersionSpec, expected, generate, record
from bench.scratch import scratch_database
from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.database import create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.locations import Roots
from controlplane.jobs.service import Jobs
from controlplane.models import catalog
from controlplane.models.events import Visibility
from controlplane.models.metadata import validate_metadata
from controlplane.models.projection import ModelsProjection
from controlplane.models.query.query import parse
from controlplane.models.query.reference import facet_counts, search
from controlplane.models.service import Models
from controlplane.projections.runner import ProjectionRunner

CONCURRENCY = 16
"""Publications in flight at once, as many clients would publish."""
VIEWER = "bench-a"


async def run(
    url: str, *, models: int, versions: int, repeats: int, progress: bool = False
) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr)

    specs = generate(models=models, versions_per_model=versions)
    say(f"registry: publishing {len(specs)} versions of {models} models")
    ours = await _trainyard(url, specs, CASES, repeats, say)
    result: dict[str, Any] = {"versions": len(specs), "models": models, **ours}
    try:
        from bench.model_repository_mlflow import run_mlflow
    except ImportError as missing:
        say(f"registry: MLflow's half left out ({missing}; install the `bench` extra)")
        return {**result, "mlflow": None, "ratio_vs_mlflow": None}
    say("registry: the same versions and searches through MLflow's registry")
    async with scratch_database(url, "registry_mlflow") as mlflow_url:
        theirs = await asyncio.to_thread(run_mlflow, specs, CASES, mlflow_url, repeats=repeats)
    return {
        **result,
        "mlflow": theirs,
        "ratio_vs_mlflow": round(theirs["search_p50_ms"] / result["search_p50_ms"], 2),
    }


async def _trainyard(
    url: str,
    specs: Sequence[VersionSpec],
    cases: Sequence[SearchCase],
    repeats: int,
    say: Any,
) -> dict[str, Any]:
    async with scratch_database(url, "registry") as database:
        pool = await create_pool(database)
        store = EventStore(pool, EVENT_REGISTRY)
        try:
            with tempfile.TemporaryDirectory() as home:
                service = Models(store, FileArtifactStore(Path(home)), Jobs(store), roots=Roots())
                publish_s = await _publish_all(service, specs)
                say(f"registry: published at {len(specs) / publish_s:.0f}/s")
                runner = ProjectionRunner(pool, store, LogListener(database), [ModelsProjection()])
                started = time.perf_counter()
                await runner.catch_up(ModelsProjection())
                projected_s = time.perf_counter() - started
                timings = await _searches(pool, specs, cases, repeats)
        finally:
            await store.close()
            await pool.close()
    every = [t for case in timings.values() for t in case]
    return {
        "publish_per_s": round(len(specs) / publish_s, 1),
        "projection_s": round(projected_s, 2),
        "search_p50_ms": ms(statistics.median(every)),
        "search_p99_ms": ms(percentile(every, 0.99)),
        "per_case": {
            label: {"p50_ms": ms(statistics.median(t)), "p99_ms": ms(percentile(t, 0.99))}
            for label, t in timings.items()
        },
    }


async def _publish_all(service: Models, specs: Sequence[VersionSpec]) -> float:
    """Seconds to publish every version, CONCURRENCY at a time (a model's versions in order:
    each is numbered after the one before)."""
    by_model: dict[tuple[str, str], list[VersionSpec]] = {}
    for spec in specs:
        by_model.setdefault((spec.tenant, spec.name), []).append(spec)
    queue: asyncio.Queue[list[VersionSpec]] = asyncio.Queue()
    for versions in by_model.values():
        queue.put_nowait(versions)

    async def publisher() -> None:
        while not queue.empty():
            for spec in queue.get_nowait():
                published = await service.publish(
                    spec.tenant,
                    spec.name,
                    _artifact(spec),
                    # Provenance is the repository's to fill in (from a job), never an upload's.
                    validate_metadata({**spec.metadata, "provenance": None}),
                    Metadata(actor=f"tenant:{spec.tenant}"),
                    visibility=Visibility.PUBLIC,
                )
                if published.version.number != spec.version:
                    raise AssertionError(f"{spec.name} published as {published.version.number}")

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(CONCURRENCY):
            group.create_task(publisher())
    return time.perf_counter() - started


async def _artifact(spec: VersionSpec) -> AsyncIterator[bytes]:
    # A few KiB of weights, distinct per version (equal bytes would share one blob).
    yield f"{spec.tenant}/{spec.name}:{spec.version}".encode() * 256


async def _searches(
    pool: Any, specs: Sequence[VersionSpec], cases: Sequence[SearchCase], repeats: int
) -> dict[str, list[float]]:
    records = [record(spec) for spec in specs]
    timings: dict[str, list[float]] = {case.label: [] for case in cases}
    for _ in range(repeats):
        for case in cases:
            query = parse(case.query)
            started = time.perf_counter()
            page = await catalog.search(pool, query, viewer=VIEWER, limit=50)
            timings[case.label].append(time.perf_counter() - started)
            matches = search(query, records)
            if page.total != len(expected(records, case)) or page.facets != facet_counts(matches):
                raise AssertionError(f"{case.label}: Trainyard's answer is not the reference's")
    return timings


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)
