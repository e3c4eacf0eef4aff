"""`trainyard bench api`: submit latency at a steady rate, and SSE delivery latency to many
subscribers, against a real `trainyard serve` process on loopback.

- submit: an open loop of POST /v1/jobs at `rate` per second (latencies include queueing when
  the server falls behind, as a user would see them), after a warm-up of WARM_UP_S at that rate.
  In turns with it, the same loop against the floor (bench/api_floor.py: aiohttp and asyncpg
  inserting one row a submit, nothing else), the reference in the same run:
  `submit_p99_vs_floor` is what the control plane adds, comparable across hosts whose absolute
  figures differ severalfold.
- SSE: `subscribers` streams spread over `jobs` jobs; events are appended at `event_rate` per
  second through the job service, and each delivery's latency runs from just before the append
  (so it includes the commit) to its receipt by the client; `sse_deliveries_missing` counts those
  still not received LAST_DELIVERIES_S after the last append.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import aiohttp

from bench import api_floor
from bench.scratch import scratch_database
from controlplane.clock import SYSTEM_CLOCK
from controlplane.database import create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.images import DEFAULT_IMAGES
from controlplane.jobs.lifecycle import Deploy, EnterPhase, JobStatus, SaveCheckpoint
from controlplane.jobs.service import Jobs
from harness.served import ServedControlPlane, free_port

MANIFEST = {"name": "bench", "image": DEFAULT_IMAGES, "command": ["python", "train.py"]}
UNLIMITED = {"submissions_per_s": 100_000, "submission_burst": 100_000, "queued_jobs": 10_000_000}
"""The bench tenant's limits: as high as they go where the benchmark would reach them."""
AGENT = Metadata(actor="agent:bench")
WARM_UP_S = 1.0
"""The submits' warm-up, not timed: the client opens its connections, and the server's pool its
own and their prepared statements, as the rate first asks for them. Timed, that first second
alone gave 15 to 45 of 2,000 submits over 10 ms (2026-12-01), which is the p99 by itself: a
figure of the client's and the server's start, not of serving at that rate."""
SLICE_S = 5.0
"""How long each turn of submits to one server lasts (`submits_beside_floor`)."""
SETTLE_S = 0.2
"""The untimed pause after each turn."""
LAST_DELIVERIES_S = 10.0
"""How long the last deliveries may take once the appends end before one is counted lost."""


async def run(
    url: str,
    *,
    seconds: float,
    rate: float = 200,
    subscribers: int = 1000,
    jobs: int = 100,
    event_rate: float = 50,
    progress: bool = False,
) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr)

    async with scratch_database(url, "api") as database:
        with tempfile.TemporaryDirectory() as home:
            # The subscribers are the admin's: they count against the server's limit only.
            streams = {"TRAINYARD_MAX_STREAMS": str(max(subscribers, 1) + 10)}
            plane = ServedControlPlane(database, Path(home), env=streams)
            await plane.start()
            try:
                headers = {"Authorization": f"Bearer {plane.admin_token}"}
                connector = aiohttp.TCPConnector(limit=0)
                async with (
                    aiohttp.ClientSession(plane.url, headers=headers, connector=connector) as ours,
                    floor_served(database) as floor,
                ):
                    await _create_tenant(ours)
                    say(f"submitting at {rate:g}/s for {seconds:g}s, and as long to the floor ...")
                    submitted = await submits_beside_floor(ours, floor, rate, seconds)
                    say(
                        f"{subscribers} SSE subscribers on {jobs} jobs, {event_rate:g} events/s ..."
                    )
                    delivered = await sse(database, ours, subscribers, jobs, event_rate, seconds)
            finally:
                await plane.stop()
    return {**submitted, **delivered}


@contextlib.asynccontextmanager
async def floor_served(database: str) -> AsyncIterator[aiohttp.ClientSession]:
    """The floor (bench/api_floor.py) serving on `database`, and a session to it."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bench.api_floor", database, str(port)),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        if (await process.stdout.readline()).decode().strip() != api_floor.READY:
            raise RuntimeError(f"the floor's server did not start (status {await process.wait()})")
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", connector=connector) as floor:
            yield floor
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def submits_beside_floor(
    ours: aiohttp.ClientSession, floor: aiohttp.ClientSession, rate: float, seconds: float
) -> dict[str, Any]:
    """`submits` to the control plane (`ours`) and to the floor, in turns of SLICE_S: the host's
    speed drifts within minutes (a 5-million-step Python loop took 0.49 s at 17:30 and 0.19 s
    at 18:05 on 2026-12-03), and taken in turns, both figures see the same host. Each turn ends
    with SETTLE_S untimed, so that what one server still does after its last answer
    (projections, here) is not timed on the other."""
    for session in (ours, floor):
        await _open_loop(session, rate, WARM_UP_S, "bench")
    ours_s: list[float] = []
    floor_s: list[float] = []
    ours_busy_s = 0.0
    left = seconds
    while left > 0:
        turn = min(SLICE_S, left)
        started = time.perf_counter()
        ours_s += await _open_loop(ours, rate, turn, "bench")
        ours_busy_s += time.perf_counter() - started
        await asyncio.sleep(SETTLE_S)
        floor_s += await _open_loop(floor, rate, turn, "bench")
        await asyncio.sleep(SETTLE_S)
        left -= turn
    return {
        **_submit_figures(rate, ours_s, ours_busy_s),
        "submit_floor_p50_ms": round(statistics.median(floor_s) * 1000, 2),
        "submit_floor_p99_ms": round(_p99(floor_s) * 1000, 2),
        "submit_p99_vs_floor": round(_p99(ours_s) / _p99(floor_s), 2),
    }


async def _create_tenant(session: aiohttp.ClientSession) -> None:
    async with session.post("/v1/tenants", json={"name": "bench"}) as response:
        if response.status != 201:
            raise RuntimeError(f"create tenant: {response.status} {await response.text()}")
    # The benchmark measures the API, not the limits that protect it from one tenant.
    async with session.put("/v1/tenants/bench/limits", json=UNLIMITED) as response:
        if response.status != 200:
            raise RuntimeError(f"tenant limits: {response.status} {await response.text()}")


async def _submit(session: aiohttp.ClientSession, tenant: str = "bench") -> UUID:
    async with session.post("/v1/jobs", params={"tenant": tenant}, json=MANIFEST) as response:
        if response.status != 201:
            raise RuntimeError(f"submit: {response.status} {await response.text()}")
        return UUID((await response.json())["id"])


async def submits(
    session: aiohttp.ClientSession, rate: float, seconds: float, tenant: str = "bench"
) -> dict[str, Any]:
    """POST /v1/jobs (as the admin, for `tenant`) at `rate` per second for `seconds`, after
    WARM_UP_S at that rate that are not timed."""
    await _open_loop(session, rate, WARM_UP_S, tenant)
    start = time.perf_counter()
    latencies = await _open_loop(session, rate, seconds, tenant)
    return _submit_figures(rate, latencies, time.perf_counter() - start)


def _submit_figures(rate: float, latencies: list[float], elapsed_s: float) -> dict[str, Any]:
    return {
        "submit_rate_target_per_s": rate,
        "submit_warm_up_s": WARM_UP_S,
        "submit_per_s": round(len(latencies) / elapsed_s, 1),
        "submit_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "submit_p99_ms": round(_p99(latencies) * 1000, 2),
    }


async def _open_loop(
    session: aiohttp.ClientSession, rate: float, seconds: float, tenant: str
) -> list[float]:
    """Each submit's latency, from the instant it was due: one every 1/`rate` s for `seconds`,
    each on its own, whether the ones before have been answered or not."""
    latencies: list[float] = []

    async def one(at: float) -> None:
        await _submit(session, tenant)
        # Measured from the scheduled instant: a server that falls behind shows as latency.
        latencies.append(time.perf_counter() - at)

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for i in range(int(rate * seconds)):
            at = start + i / rate
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            # Each task made when due: made all at once, 2,000 of them held the client's loop
            # for tens of milliseconds, which the first submits then counted as the server's.
            group.create_task(one(at))
    return latencies


async def sse(
    database: str,
    session: aiohttp.ClientSession,
    subscribers: int,
    job_count: int,
    event_rate: float,
    seconds: float,
    tenant: str = "bench",
) -> dict[str, Any]:
    """`subscribers` SSE streams over `job_count` new jobs of `tenant`, while their events are
    appended at `event_rate` per second for `seconds`: each delivery's latency."""
    pool = await create_pool(database, min_size=2, max_size=4)
    store = EventStore(pool, EVENT_REGISTRY)
    service = Jobs(store)
    try:
        job_ids = [await _submit(session, tenant) for _ in range(job_count)]
        for job_id in job_ids:
            await service.execute(job_id, Deploy(["bench"], [], 1, SYSTEM_CLOCK.now()), AGENT)
            await service.execute(
                job_id, EnterPhase(JobStatus.PROCESSING, SYSTEM_CLOCK.now()), AGENT
            )
        appended: dict[int, float] = {}
        received: list[tuple[int, float]] = []
        ready = asyncio.Semaphore(0)
        arrived = asyncio.Event()
        readers = [
            asyncio.create_task(
                _subscribe(session, job_ids[i % job_count], ready, received, arrived)
            )
            for i in range(subscribers)
        ]
        for _ in range(subscribers):
            await ready.acquire()
        start = time.perf_counter()
        count = int(event_rate * seconds)
        for i in range(count):
            await asyncio.sleep(max(0.0, start + i / event_rate - time.perf_counter()))
            before = time.perf_counter()
            job_id = job_ids[i % job_count]
            command = SaveCheckpoint(i, f"/ckpt/{i}", 1, 0.1, SYSTEM_CLOCK.now())
            await service.execute(job_id, command, AGENT)
            history = await service.history(job_id)
            appended[history[-1].position] = before
        expected = count * subscribers // job_count
        # The last deliveries arrive, however loaded the machine: one still missing after
        # LAST_DELIVERIES_S is counted lost (a late one shows in the latencies).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LAST_DELIVERIES_S):
                while _delivered(received, appended) < expected:
                    arrived.clear()
                    await arrived.wait()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    finally:
        await store.close()
        await pool.close()
    latencies = [at - appended[position] for position, at in received if position in appended]
    return {
        "sse_subscribers": subscribers,
        "sse_events_per_s": event_rate,
        "sse_deliveries": len(latencies),
        "sse_deliveries_missing": expected - len(latencies),
        "sse_delivery_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "sse_delivery_p99_ms": round(_p99(latencies) * 1000, 2),
    }


async def _subscribe(
    session: aiohttp.ClientSession,
    job_id: UUID,
    ready: asyncio.Semaphore,
    received: list[tuple[int, float]],
    arrived: asyncio.Event,
) -> None:
    """Read one job's SSE; signal `ready` once the past is read (its 3 events), and `arrived`
    at each delivery after it."""
    seen = 0
    async with session.get(f"/v1/jobs/{job_id}/events") as response:
        async for raw in response.content:
            line = raw.decode()
            if not line.startswith("data: "):
                continue
            seen += 1
            if seen == 3:
                ready.release()
            elif seen > 3:
                received.append((json.loads(line[6:])["position"], time.perf_counter()))
                arrived.set()


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


def _delivered(received: list[tuple[int, float]], appended: dict[int, float]) -> int:
    """The deliveries of the events the benchmark appended (not of the jobs' earlier ones)."""
    return sum(1 for position, _ in received if position in appended)
