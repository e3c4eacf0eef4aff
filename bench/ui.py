"""`trainyard bench ui`: the dashboard's cost with a big history, against a real `trainyard
serve` process on loopback and a scratch database holding `jobs` jobs (100,000 by default) of
one tenant, with the requests the dashboard's pages make, through its session cookie.

- jobs_page_p95_ms: the jobs page's data, `GET /v1/jobs?limit=50` (with its total), over the
  first page, the next 19 pages by cursor, and filtered by state and by label; the 95th
  percentile of the response times, measured at the client (loopback: the server's time);
  `jobs_page_p95_ms_by_filter` each filter's. Measured once the table is vacuumed and
  analyzed, as autovacuum keeps it in a database that has run a while.
- job_page_p95_ms: a job page's data, its four reads made at once as the page makes them (the
  job, its history, its pending reasons, its metrics), for random jobs; the 95th percentile of
  the time until the last has answered.
- first_load_kb: what the first load transfers, compressed as the server sends it: the page,
  every script and style it loads (imports followed), the session and the first jobs page.
- sse_reconnect_gap: a job printing numbered lines is followed over `/logs?follow=true`; the
  connection is dropped `reconnects` times and resumed with `Last-Event-ID`: the lines missed
  plus the lines received twice (target 0).
- search_page: a finished ASHA search of `trials` trials (1,000 by default; three rungs, 30,
  90 and 270 steps, every step's loss reported: 70,000 metric reports) is opened in the real
  browser (Debian's headless Chromium through Selenium, signed in with the session cookie),
  `renders` times, each a fresh page load. first_full_render_ms: from the navigation's start
  until the page has drawn every part (the curves chart with every trial, the parallel
  coordinates, the trials' table) and the browser has had a frame to paint them, by the page's
  own clock (`window.__trainyard.searchRendered`), the median (and the slowest) of the
  loads; route_to_render_ms the same from the page's route on (its three reads and the
  drawing, without loading the page and its scripts); drawing_ms the part of it after the
  last read answered (the drawing alone). curves_request_ms: the median time of
  GET /v1/searches/{id}/curves (every trial's curve, one request); curves_kb its size on the
  wire (gzip) and curves_json_kb unpacked; trials_request_ms the median of GET
  /v1/searches/{id}/trials (every trial's state, rung, metric and hyperparameters), the
  page's other large read.

The jobs are written through the store (the job lifecycle's own events, in transactions of
500 jobs): 80 % submitted and cancelled, 20 % run to COMPLETED, under five labels; the
server's projections catch up before anything is measured.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import aiohttp
import asyncpg

from bench.scratch import scratch_database
from controlplane.clock import SYSTEM_CLOCK
from controlplane.database import connect, create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.events import JobEvent
from controlplane.jobs.lifecycle import (
    Cancel,
    Command,
    Complete,
    Deploy,
    EnterPhase,
    JobStatus,
    Submit,
    decide,
    evolve,
)
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.streams import job_stream
from controlplane.logs.lines import LogLine, Stream
from controlplane.logs.store import write_lines
from controlplane.searches.events import (
    BestUpdated,
    SearchEnded,
    SearchEvent,
    SearchSubmitted,
    TrialCreated,
    TrialPromoted,
    TrialPruned,
    TrialRungFinished,
)
from controlplane.searches.lifecycle import trial_job_id
from controlplane.searches.spec import SearchSpec, searcher_for
from controlplane.searches.streams import search_stream
from controlplane.ui.sessions import COOKIE
from harness.agent_process import AgentProcess
from harness.served import ServedControlPlane
from runners import protocol

TENANT = "bench"
TEAMS = ("vision", "speech", "nlp", "rl", "infra")
BATCH = 500
TARGETS = {
    "jobs_page_p95_ms": 300,
    "job_page_p95_ms": 300,
    "first_load_kb": 300,
    "search_page_first_full_render_ms": 3000,
}
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
LINES = 600
PRINTER = (
    "import time\n"
    f"for i in range({LINES}):\n"
    "    print(f'line {i}', flush=True)\n"
    "    time.sleep(0.01)\n"
)
_IMPORT = re.compile(r"""(?:import|from)\s*['"](\./[\w./-]+\.js)['"]""")
_ASSET = re.compile(r"""(?:src|href)="(/ui/static/[\w./-]+)\"""")


async def run(
    url: str,
    *,
    jobs: int = 100_000,
    requests: int = 200,
    reconnects: int = 5,
    trials: int = 1000,
    renders: int = 5,
    progress: bool = False,
) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr, flush=True)

    async with scratch_database(url, "ui") as database:
        with tempfile.TemporaryDirectory() as home:
            # The learners run as users of their own: they must pass through to their folders.
            os.chmod(home, 0o711)
            plane = ServedControlPlane(database, Path(home))
            await plane.start()
            try:
                token = await _tenant(plane)
                say(f"writing {jobs} jobs ...")
                started = time.perf_counter()
                ids = await _fill(database, jobs)
                say(f"... in {time.perf_counter() - started:.0f}s; waiting for the projections")
                async with aiohttp.ClientSession(plane.url) as session:
                    cookie = await _sign_in(session, token)
                    headers = {"Cookie": f"{COOKIE}={cookie}"}
                    await _caught_up(session, headers, jobs)
                    await _settled(database)
                    say("measuring the pages ...")
                    pages, by_filter = await _jobs_pages(session, headers, requests)
                    figures = {
                        "jobs": jobs,
                        "jobs_page_p95_ms": pages,
                        "jobs_page_p95_ms_by_filter": by_filter,
                        "job_page_p95_ms": await _job_pages(session, headers, ids, requests),
                        "first_load_kb": await _first_load(plane.url, headers),
                    }
                    say("following a job's logs across reconnects ...")
                    figures["sse_reconnect_gap"] = await _reconnects(
                        plane, Path(home), session, headers, reconnects
                    )
                    say(f"drawing a search of {trials} trials in the browser ...")
                    figures["search_page"] = await _search_page(
                        plane.url, database, session, cookie, trials, renders
                    )
            finally:
                await plane.stop()
    return {**figures, "targets": {**TARGETS, "sse_reconnect_gap": 0}}


async def _tenant(plane: ServedControlPlane) -> str:
    admin = {"Authorization": f"Bearer {plane.admin_token}"}
    async with (
        aiohttp.ClientSession(plane.url, headers=admin) as session,
        session.post("/v1/tenants", json={"name": TENANT}) as response,
    ):
        if response.status != 201:
            raise RuntimeError(f"create tenant: {response.status} {await response.text()}")
        token: str = (await response.json())["token"]
    return token


async def _sign_in(session: aiohttp.ClientSession, token: str) -> str:
    async with session.post("/ui/session", json={"token": token}) as response:
        if response.status != 200:
            raise RuntimeError(f"sign in: {response.status} {await response.text()}")
        return response.cookies[COOKIE].value


def _history(job_id: UUID, k: int) -> list[JobEvent]:
    """A job's events: submitted and cancelled, or (every fifth) run to COMPLETED."""
    at = SYSTEM_CLOCK.now()
    manifest = JobManifest.model_validate(
        {
            "name": f"train-{k % 50}",
            "image": "trainyard-learner",
            "command": ["python", "train.py"],
            "labels": {"team": TEAMS[k % len(TEAMS)]},
        }
    )
    commands: list[Command] = [Submit(job_id, TENANT, manifest, at)]
    if k % 5:
        commands.append(Cancel("bench", at))
    else:
        commands += [
            Deploy(["bench-node"], [], 1, at),
            EnterPhase(JobStatus.DOWNLOADING, at),
            EnterPhase(JobStatus.PROCESSING, at),
            EnterPhase(JobStatus.STORING, at),
            Complete([0], at),
        ]
    events: list[JobEvent] = []
    job = None
    for command in commands:
        new = decide(command, job)
        for event in new:
            job = evolve(job, event)
        events.extend(new)
    return events


async def _fill(database: str, count: int) -> list[UUID]:
    pool = await create_pool(database, min_size=1, max_size=2)
    store = EventStore(pool, EVENT_REGISTRY)
    metadata = Metadata(actor="bench", tenant=TENANT)
    ids = []
    try:
        for start in range(0, count, BATCH):
            async with pool.acquire() as conn, conn.transaction():
                for k in range(start, min(start + BATCH, count)):
                    job_id = uuid4()
                    await store.append(
                        job_stream(job_id), 0, _history(job_id, k), metadata, conn=conn
                    )
                    ids.append(job_id)
    finally:
        await store.close()
        await pool.close()
    return ids


async def _settled(database: str) -> None:
    """What autovacuum does in a database that has run a while, and a just-filled one has not
    had yet: the visibility map and the planner's statistics, so that the jobs list's count
    reads its index alone as it would in service."""
    conn = await connect(database, role=None)  # as the owner: only it may vacuum the table
    try:
        await conn.execute("VACUUM (ANALYZE) job_status")
    finally:
        await conn.close()


async def _caught_up(session: aiohttp.ClientSession, headers: dict[str, str], jobs: int) -> None:
    async with asyncio.timeout(1800):
        while True:
            async with session.get("/v1/jobs", params={"limit": "1"}, headers=headers) as response:
                if (await response.json())["total"] >= jobs:
                    return
            await asyncio.sleep(1)


async def _timed(
    session: aiohttp.ClientSession, path: str, headers: dict[str, str], params: Any = None
) -> tuple[float, Any]:
    started = time.perf_counter()
    async with session.get(path, params=params, headers=headers) as response:
        body = await response.json()
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status} {body}")
    return (time.perf_counter() - started) * 1000, body


async def _jobs_pages(
    session: aiohttp.ClientSession, headers: dict[str, str], requests: int
) -> tuple[float, dict[str, float]]:
    """The p95 over every request, and each filter's own."""
    filters: list[dict[str, str]] = [
        {},
        {"state": "COMPLETED"},
        {"state": "CANCELLED"},
        {"label": "team=nlp"},
        {"state": "COMPLETED", "label": "team=rl"},
    ]
    times: dict[str, list[float]] = {}
    while sum(map(len, times.values())) < requests:
        for query in filters:
            name = "&".join(f"{k}={v}" for k, v in query.items()) or "all"
            cursor = None
            for _ in range(20 if not query else 4):  # the first page, then by cursor
                params = {"limit": "50", **query, **({"cursor": cursor} if cursor else {})}
                took, body = await _timed(session, "/v1/jobs", headers, params)
                times.setdefault(name, []).append(took)
                cursor = body["next_cursor"]
                if cursor is None:
                    break
    every = [t for each in times.values() for t in each]
    return _p95(every), {name: _p95(each) for name, each in times.items()}


async def _job_pages(
    session: aiohttp.ClientSession, headers: dict[str, str], ids: list[UUID], requests: int
) -> float:
    rng = random.Random(0)
    times = []
    for job_id in rng.sample(ids, min(requests, len(ids))):
        base = f"/v1/jobs/{job_id}"
        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for part in ("", "/history", "/pending", "/metrics"):
                group.create_task(_timed(session, base + part, headers))
        times.append((time.perf_counter() - started) * 1000)
    return _p95(times)


async def _first_load(url: str, headers: dict[str, str]) -> float:
    """Bytes on the wire (compressed as sent) of the page, its assets and its first data."""
    total = 0
    wire = {"Accept-Encoding": "gzip", **headers}
    async with aiohttp.ClientSession(url, auto_decompress=False) as session:

        async def fetch(path: str) -> bytes:
            nonlocal total
            async with session.get(path, headers=wire) as response:
                body = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{path}: {response.status}")
                total += len(body)
                encoded = response.headers.get("Content-Encoding") == "gzip"
            return gzip.decompress(body) if encoded else body

        page = (await fetch("/ui/")).decode()
        pending = _ASSET.findall(page)
        seen: set[str] = set()
        while pending:
            path = pending.pop()
            if path in seen:
                continue
            seen.add(path)
            text = (await fetch(path)).decode()
            if path.endswith(".js"):
                folder = path.rsplit("/", 1)[0]
                pending += [f"{folder}/{name[2:]}" for name in _IMPORT.findall(text)]
        await fetch("/ui/session")
        await fetch("/v1/jobs?limit=50")
    return round(total / 1024, 1)


async def _reconnects(
    plane: ServedControlPlane,
    home: Path,
    session: aiohttp.ClientSession,
    headers: dict[str, str],
    reconnects: int,
) -> int:
    pool = await create_pool(plane.database_url, min_size=1, max_size=2)
    agent = AgentProcess(
        plane.database_url, home / "agent", "bench-ui", fake_gpus=0, log=home / "agent.log"
    )
    try:
        try:
            await agent.start(pool)
        except RuntimeError as exc:
            tail = (home / "agent.log").read_text()[-2000:]
            raise RuntimeError(f"{exc}; its output:\n{tail}") from None
        csrf = await _csrf(session, headers)
        manifest = {
            "name": "printer",
            "image": "trainyard-learner",
            "command": [sys.executable, "-c", PRINTER],
        }
        async with session.post(
            "/v1/jobs", json=manifest, headers={**headers, "X-CSRF-Token": csrf}
        ) as response:
            if response.status != 201:
                raise RuntimeError(f"submit: {response.status} {await response.text()}")
            job_id = (await response.json())["id"]
        received: list[str] = []
        last_id: str | None = None
        for round_ in range(reconnects + 1):
            last_id, ended = await _follow(
                session,
                headers,
                job_id,
                last_id,
                received,
                cut_after=None if round_ == reconnects else 60,
            )
            if ended:
                break
        numbers = [int(line.split()[1]) for line in received if line.startswith("line ")]
        missed = LINES - len(set(numbers))
        doubled = len(numbers) - len(set(numbers))
        return missed + doubled
    finally:
        await agent.stop()
        await pool.close()


async def _csrf(session: aiohttp.ClientSession, headers: dict[str, str]) -> str:
    async with session.get("/ui/session", headers=headers) as response:
        csrf: str = (await response.json())["csrf"]
    return csrf


async def _follow(
    session: aiohttp.ClientSession,
    headers: dict[str, str],
    job_id: str,
    last_id: str | None,
    received: list[str],
    *,
    cut_after: int | None,
) -> tuple[str | None, bool]:
    """Follow the job's log stream from `last_id`, appending the lines received; drop the
    connection after `cut_after` lines (None: to the end). The last id seen, and whether the
    stream ended."""
    sent = {**headers, **({"Last-Event-ID": last_id} if last_id else {})}
    count = 0
    async with session.get(
        f"/v1/jobs/{job_id}/logs", params={"follow": "true"}, headers=sent
    ) as response:
        event_id, kind, data = None, "message", []
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
            elif line == "" and data:
                if kind == "end":
                    return last_id, True
                received.append(json.loads("\n".join(data))["line"])
                last_id, kind, data = event_id, "message", []
                count += 1
                if cut_after is not None and count >= cut_after:
                    return last_id, False  # the connection drops here
    return last_id, True


async def _search_page(
    url: str,
    database: str,
    session: aiohttp.ClientSession,
    cookie: str,
    trials: int,
    renders: int,
) -> dict[str, Any]:
    pool = await create_pool(database, min_size=1, max_size=2)
    try:
        search_id = await write_search(pool, TENANT, trials, budget=270)
    finally:
        await pool.close()
    headers = {"Cookie": f"{COOKIE}={cookie}", "Accept-Encoding": "gzip"}
    path = f"/v1/searches/{search_id}"
    async with asyncio.timeout(600):  # until the read model has the whole search
        while True:
            async with session.get(path, headers=headers) as response:
                if response.status == 200 and (await response.json())["state"] == "completed":
                    break
            await asyncio.sleep(0.5)
    times = []
    listed = []
    wire = 0
    unpacked = 0
    # As the browser reads it: compressed on the wire, unpacked by the client.
    async with aiohttp.ClientSession(url, auto_decompress=False) as raw:
        for _ in range(renders):
            listed.append((await _timed(session, f"{path}/trials", headers))[0])
            started = time.perf_counter()
            async with raw.get(f"{path}/curves", headers=headers) as response:
                body = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"curves: {response.status} {body[:200]!r}")
                encoded = response.headers.get("Content-Encoding") == "gzip"
            wire = len(body)
            unpacked = len(gzip.decompress(body) if encoded else body)
            times.append((time.perf_counter() - started) * 1000)
    figures: dict[str, Any] = {
        "trials": trials,
        "curves_request_ms": round(statistics.median(times), 1),
        "curves_kb": round(wire / 1024, 1),
        "curves_json_kb": round(unpacked / 1024, 1),
        "trials_request_ms": round(statistics.median(listed), 1),
    }
    rendered = await asyncio.to_thread(_render, url, cookie, search_id, trials, renders)
    return {**figures, **rendered}


def _render(url: str, cookie: str, search_id: UUID, trials: int, renders: int) -> dict[str, Any]:
    """The search's page loaded afresh `renders` times in headless Chromium, each until the
    page says it has drawn every part (see the module's docstring)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return {"skipped": "selenium missing: pip install -e '.[test]'"}
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        return {"skipped": "chromium missing: apt-get install chromium chromium-driver"}
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root in a container, Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
    ):
        options.add_argument(argument)
    # Selenium Manager never runs (the driver's path is given) and never downloads a browser.
    os.environ["SE_OFFLINE"] = "true"
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    loads: list[dict[str, Any]] = []
    try:
        driver.get(f"{url}/ui/static/app.css")  # the cookie's origin, without the app
        driver.add_cookie({"name": COOKIE, "value": cookie, "path": "/"})
        for _ in range(renders):
            driver.get("about:blank")
            driver.get(f"{url}/ui/#/searches/{search_id}")
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                done = driver.execute_script("return window.__trainyard?.searchRendered?.()")
                if done:
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError("the search's page was not drawn within 300 s")
            if done["curves"] != trials or done["trials"] != trials:
                raise RuntimeError(f"the page drew {done}, not {trials} trials")
            loads.append(done)
    finally:
        driver.quit()
    whole = [load["at_ms"] for load in loads]
    routed = [load["since_route_ms"] for load in loads]
    drawing = [load["since_route_ms"] - load["fetched_ms"] for load in loads]
    return {
        "renders": renders,
        "first_full_render_ms": round(statistics.median(whole), 1),
        "first_full_render_ms_max": round(max(whole), 1),
        "route_to_render_ms": round(statistics.median(routed), 1),
        "drawing_ms": round(statistics.median(drawing), 1),
    }


def _p95(values: list[float]) -> float:
    if len(values) < 2:  # a filter with one page only, in a small run
        return round(max(values), 1)
    return round(statistics.quantiles(values, n=20)[18], 1)


OPTIMIZERS = ("sgd", "adam", "adamw")


def _trial_spec(trials: int, budget: int) -> SearchSpec:
    """An ASHA search over four hyperparameters (a log-uniform, a uniform, an integer and a
    choice), three rungs (budget / 9, / 3, whole), minimising `loss`."""
    return SearchSpec.model_validate(
        {
            "name": "sweep",
            "trial": {"name": "t", "image": "trainyard-learner", "command": ["python", "train.py"]},
            "space": {
                "params": {
                    "lr": {"type": "log_uniform", "low": 1e-5, "high": 1e-1},
                    "dropout": {"type": "uniform", "low": 0.0, "high": 0.5},
                    "layers": {"type": "int", "low": 1, "high": 8},
                    "optimizer": {"type": "choice", "values": list(OPTIMIZERS)},
                }
            },
            "searcher": {"name": "asha", "min_budget": max(budget // 9, 1), "reduction": 3},
            "metric": {"name": "loss", "mode": "min"},
            "budget": {"unit": "steps", "max": budget},
            "max_trials": trials,
            "max_concurrent_trials": 8,
        }
    )


def _loss(point: dict[str, Any], step: int, rng: random.Random) -> float:
    """A plausible training loss: falls with the steps towards a floor the hyperparameters set
    (best near lr 3e-3, dropout 0.2, adam), with a little noise."""
    lr: float = point["lr"]
    dropout: float = point["dropout"]
    layers: int = point["layers"]
    floor = 0.2 + 0.15 * abs(math.log10(lr) + 2.5) + abs(dropout - 0.2) + 0.02 * layers
    floor += {"sgd": 0.3, "adam": 0.0, "adamw": 0.05}[point["optimizer"]]
    return floor + 2.0 * math.exp(-step / (20 + 10 * layers)) + rng.gauss(0, 0.01)


async def write_search(
    pool: asyncpg.Pool, tenant: str, trials: int, *, budget: int = 90, seed: int = 0
) -> UUID:
    """A finished ASHA search of `trials` trials, as its driver and learners would have left
    it: its events (every trial at rung 0, a third promoted to rung 1, a ninth to rung 2, the
    rest pruned, the best recorded, the search completed) appended in one transaction, so that
    its driver never sees a trial running, and each trial's jobs' metric reports stored as
    their learners' stdout. Returns the search's id."""
    rng = random.Random(seed)
    spec = _trial_spec(trials, budget)
    rungs = searcher_for(spec).rungs
    search_id = uuid4()
    at = SYSTEM_CLOCK.now()
    events: list[SearchEvent] = [
        SearchSubmitted(at=at, search_id=search_id, tenant=tenant, spec=spec)
    ]
    lines: list[LogLine] = []
    results: list[tuple[int, int, float]] = []  # (rung, trial, metric)
    for number in range(trials):
        point = {
            "lr": 10 ** rng.uniform(-5, -1),
            "dropout": rng.uniform(0, 0.5),
            "layers": rng.randint(1, 8),
            "optimizer": rng.choice(OPTIMIZERS),
        }
        reached = 2 if number % 9 == 0 else 1 if number % 3 == 0 else 0
        start = 0
        for rung in range(min(reached, len(rungs) - 1) + 1):
            job_id = trial_job_id(search_id, number, rung)
            if rung == 0:
                events.append(
                    TrialCreated(
                        at=at,
                        number=number,
                        point=point,
                        budget=rungs[0],
                        job_id=job_id,
                        reason="a new trial at rung 0",
                    )
                )
            else:
                events.append(
                    TrialPromoted(
                        at=at,
                        number=number,
                        rung=rung,
                        budget=rungs[rung],
                        job_id=job_id,
                        reason=f"in the top third of rung {rung - 1}",
                    )
                )
            loss = 0.0
            for seq, step in enumerate(range(start + 1, rungs[rung] + 1), 1):
                loss = _loss(point, step, rng)
                report = protocol.Metric(step=step, values={"loss": loss}, at=at)
                lines.append(LogLine(job_id, 1, 0, Stream.STDOUT, seq, at, protocol.encode(report)))
            start = rungs[rung]
            events.append(TrialRungFinished(at=at, number=number, rung=rung, metric=loss))
            results.append((rung, number, loss))
        if reached < len(rungs) - 1:
            events.append(TrialPruned(at=at, number=number, reason="not in the top third"))
    top, best, metric = min(results, key=lambda r: (-r[0], r[2]))
    events += [
        BestUpdated(at=at, number=best, rung=top, metric=metric),
        SearchEnded(at=at, state="completed", reason="every trial ran"),
    ]
    store = EventStore(pool, EVENT_REGISTRY)
    try:
        async with pool.acquire() as conn, conn.transaction():
            await store.append(
                search_stream(search_id),
                0,
                events,
                Metadata(actor="bench", tenant=tenant),
                conn=conn,
            )
    finally:
        await store.close()
    for start in range(0, len(lines), 5000):
        await write_lines(pool, lines[start : start + 5000])
    return search_id
