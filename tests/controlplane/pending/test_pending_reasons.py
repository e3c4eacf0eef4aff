"""Pending reasons recorded: the recorder judges every queued job against the real queue and
nodes, records the changes of its reasons as events, and the API, the SSE stream and the audit
view answer "why is it pending, and why was it from 10:00 to 10:40"."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.agents.claims import Releases, claim
from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import Nodes, NodeSpec
from controlplane.clock import ManualClock
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.http.app import create_app
from controlplane.http.keys import POOL, STORE
from controlplane.jobs.lifecycle import Cancel, Complete, EnterPhase, JobStatus
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.projection import JobsProjection
from controlplane.jobs.service import Jobs
from controlplane.pending import recorder as recorder_module
from controlplane.pending.projection import PendingProjection
from controlplane.pending.recorder import PendingRecorder
from controlplane.pending.streams import pending_stream
from controlplane.pending.views import PendingView, pending_view
from controlplane.projections.runner import ProjectionRunner
from controlplane.scheduling.claim import Claim
from tests.polling import eventually
from tests.tenancy import Tokens, auth

Client = TestClient[Any, Any]
MANIFEST: dict[str, Any] = {
    "name": "train",
    "image": "trainyard-learner:latest",
    "command": ["python", "train.py"],
    "gpus_per_learner": 1,
}


def gpus(node: str, count: int) -> list[GpuInfo]:
    return [
        GpuInfo(index=i, uuid=f"GPU-{node}-{i}", model="fake", memory_mb=80_000, healthy=True)
        for i in range(count)
    ]


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    app = create_app(db_url, poll_interval=0.1, sse_heartbeat_s=0.2)
    async with TestClient(TestServer(app)) as client:
        yield client


async def submit(client: Client, token: str, **changes: Any) -> str:
    response = await client.post("/v1/jobs", json={**MANIFEST, **changes}, headers=auth(token))
    assert response.status == 201, await response.text()
    job_id: str = (await response.json())["id"]
    return job_id


async def pending(client: Client, token: str, job: str, **query: str) -> dict[str, Any]:
    response = await client.get(f"/v1/jobs/{job}/pending", params=query, headers=auth(token))
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


def _json(view: PendingView) -> dict[str, Any]:
    """The view as the API sends it."""
    return view.model_dump(mode="json", by_alias=True)


def kinds(view: dict[str, Any]) -> set[str]:
    return {r["reason"] for r in view["reasons"]}


async def until_reasons(client: Client, token: str, job: str, expected: set[str]) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def shown() -> bool:
        seen.update(await pending(client, token, job))
        return kinds(seen) == expected

    try:
        await eventually(shown, seconds=10)
    except TimeoutError:
        raise AssertionError(f"{job}: {seen}") from None
    return seen


async def test_every_queued_job_says_why_and_its_history_is_recorded(
    client: Client, tokens: Tokens
) -> None:
    nodes = Nodes(client.app[POOL], client.app[STORE])
    await nodes.register(NodeSpec("n1", uuid4(), "process", 8, 65536, gpus("n1", 1)), ttl_s=60)
    first = await submit(client, tokens.acme)
    second = await submit(client, tokens.globex)
    third = await submit(client, tokens.globex, priority=5)
    never = await submit(client, tokens.globex, gpus_per_learner=2)

    # All hold nothing: globex's higher-priority job comes first and takes the one GPU.
    now = await until_reasons(client, tokens.globex, third, {"starting"})
    assert now["position"] == 1 and now["state"] == "QUEUED"
    first_now = await until_reasons(client, tokens.acme, first, {"resources", "fair_share"})
    assert first_now["position"] == 2
    reasons = {r["reason"]: r for r in first_now["reasons"]}
    assert reasons["fair_share"]["detail"] == (
        "1 job(s) of other tenants come first: tenant acme holds 0 GPU(s) at weight 1"
    )
    assert reasons["resources"] == {
        "reason": "resources",
        "blocking": "waiting",
        "detail": "no READY node has 1 free GPU(s) (the most free on one is 0)",
        "since": reasons["resources"]["since"],
    }
    second_now = await until_reasons(
        client, tokens.globex, second, {"resources", "fair_share", "priority"}
    )
    assert second_now["position"] == 3
    never_now = await until_reasons(client, tokens.globex, never, {"unschedulable"})
    assert never_now["reasons"][0]["blocking"] == "never"
    assert never_now["reasons"][0]["detail"] == (
        "needs 2 healthy GPU(s) on one node; the largest node has 1"
    )
    # Another tenant's job is not found, its reasons neither.
    response = await client.get(f"/v1/jobs/{second}/pending", headers=auth(tokens.acme))
    assert response.status == 404

    # Its `starting` is recorded once it has lasted (a claim ends most within milliseconds).
    async def recorded_starting() -> bool:
        view = await pending(client, tokens.globex, third)
        return [s["reason"] for s in view["history"]] == ["starting"]

    await eventually(recorded_starting, seconds=10)
    # The GPU frees up when globex's first job goes: the reasons move, and are recorded.
    cancelled = await client.post(f"/v1/jobs/{third}/cancel", headers=auth(tokens.globex))
    assert cancelled.status == 200
    await until_reasons(client, tokens.acme, first, {"starting"})
    await until_reasons(client, tokens.globex, second, {"resources", "fair_share"})
    gone = await until_reasons(client, tokens.globex, third, set())
    assert gone["position"] is None and gone["state"] == "CANCELLED"

    async def history_closed() -> bool:
        view = await pending(client, tokens.globex, third)
        return bool(view["history"]) and all(s["until"] for s in view["history"])

    await eventually(history_closed, seconds=10)

    async def history_moved() -> bool:
        view = await pending(client, tokens.acme, first)
        return {s["reason"]: s["until"] is None for s in view["history"]} == {
            "resources": False,
            "fair_share": False,
            "starting": True,
        }

    await eventually(history_moved, seconds=10)
    view = await pending(client, tokens.acme, first)
    assert set(view["seconds"]) == {"resources", "fair_share", "starting"}
    assert all(seconds >= 0 for seconds in view["seconds"].values())


async def test_bad_windows_are_refused(client: Client, tokens: Tokens) -> None:
    job = await submit(client, tokens.acme)
    for query, field in (
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-01-01T00:00:00"}, "until"),
        ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "until"),
    ):
        response = await client.get(
            f"/v1/jobs/{job}/pending", params=query, headers=auth(tokens.acme)
        )
        assert response.status == 400
        assert (await response.json())["field"] == field


async def test_the_stream_sends_each_change_and_ends_with_the_job(
    client: Client, tokens: Tokens
) -> None:
    job = await submit(client, tokens.acme)  # no node at all yet
    headers = auth(tokens.acme)
    async with client.get(f"/v1/jobs/{job}/pending/events", headers=headers) as response:
        assert response.status == 200
        sent: list[dict[str, Any]] = []

        async def read() -> None:
            async for raw in response.content:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    sent.append(json.loads(line.removeprefix("data: ")))

        reader = asyncio.create_task(read())

        async def seen(expected: set[str]) -> bool:
            return any(kinds(view) == expected for view in sent)

        await eventually(lambda: seen({"no_nodes"}), seconds=10)
        nodes = Nodes(client.app[POOL], client.app[STORE])
        await nodes.register(NodeSpec("n1", uuid4(), "process", 8, 65536, gpus("n1", 1)), 60)
        await eventually(lambda: seen({"starting"}), seconds=10)
        assert (await client.post(f"/v1/jobs/{job}/cancel", headers=headers)).status == 200
        async with asyncio.timeout(10):
            await reader  # the stream ends with the job
    assert sent[-1]["state"] == "CANCELLED" and sent[-1]["reasons"] == []


async def test_time_per_reason_answers_why_it_was_pending_from_ten_to_ten_forty(
    db_url: str, pool: asyncpg.Pool, store: EventStore, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    start = datetime(2026, 11, 27, 9, 50, tzinfo=UTC)
    clock = ManualClock(start)
    runner = ProjectionRunner(
        pool, store, LogListener(db_url), [JobsProjection(), PendingProjection()]
    )
    recorder = PendingRecorder(pool, store, clock=clock)
    jobs = Jobs(store, clock)
    nodes = Nodes(pool, store, clock)
    manifest = JobManifest.model_validate(MANIFEST)
    acme = Metadata(actor="tenant:acme", tenant="acme")

    async def settled(job_id: UUID, state: str) -> None:
        """Until the queue shows the job's last event (an older transaction open elsewhere on
        the server may hold it back a moment): each round must judge what came before it."""

        async def shown() -> bool:
            await runner.catch_up(JobsProjection())
            query = "SELECT state FROM job_status WHERE job_id = $1"
            return await pool.fetchval(query, job_id) == state

        await eventually(shown)

    async def round_at(at: datetime) -> None:
        clock.set(at)
        assert await recorder.record() > 0

    holder, _ = await jobs.submit("acme", manifest, acme)
    await settled(holder.job_id, "QUEUED")
    await round_at(start)  # 9:50, no node: waiting for one
    await nodes.register(NodeSpec("n1", uuid4(), "process", 8, 65536, gpus("n1", 1)), 3600)
    clock.advance(timedelta(minutes=5))  # submitted after the holder
    waiter, _ = await jobs.submit("acme", manifest, acme)
    await settled(waiter.job_id, "QUEUED")
    await round_at(start + timedelta(minutes=10))  # 10:00, the holder's turn comes first
    await jobs.execute(holder.job_id, Cancel("done", clock.now() + timedelta(minutes=30)), acme)
    await settled(holder.job_id, "CANCELLED")
    await round_at(start + timedelta(minutes=40))  # 10:30, the waiter's turn
    # 10:50: its `starting` lasted, and is recorded from when it began; then nothing changes.
    await round_at(start + timedelta(minutes=60))
    assert await recorder.record() == 0

    loaded = await jobs.load(waiter.job_id)
    assert loaded is not None
    ten, ten_forty = start + timedelta(minutes=10), start + timedelta(minutes=50)

    async def spans_applied() -> bool:
        await runner.catch_up(PendingProjection())
        view = _json(await pending_view(pool, loaded, clock.now(), since=ten, until=ten_forty))
        return len(view["history"]) == 2

    await eventually(spans_applied)
    view = _json(await pending_view(pool, loaded, clock.now(), since=ten, until=ten_forty))
    assert view["seconds"] == {"resources": 1800.0, "starting": 600.0}
    assert [(s["reason"], s["from"], s["until"]) for s in view["history"]] == [
        ("resources", ten.isoformat(), (start + timedelta(minutes=40)).isoformat()),
        ("starting", (start + timedelta(minutes=40)).isoformat(), None),
    ]
    # A round that changes nothing appends nothing: the stream has the two changes only.
    assert await store.version(pending_stream(waiter.job_id)) == 2
    # The holder left the queue: its cancel closed its spans, and the recorder appended no
    # event for that. Its `starting` since 10:00, recorded as it left, held it until then.
    changed = [e.event for e in await store.read_stream(pending_stream(holder.job_id))]
    assert [[r.reason for r in e.reasons] for e in changed] == [  # type: ignore[attr-defined]
        ["no_nodes"],
        ["starting"],
    ]
    await owner.execute("SET ROLE trainyard_auditor")  # what an auditor reads
    rows = await owner.fetch(
        "SELECT reason, seconds FROM audit.pending_reasons WHERE job_id = $1 ORDER BY started_at",
        holder.job_id,
    )
    assert [(r["reason"], r["seconds"]) for r in rows] == [
        ("no_nodes", 600.0),
        ("starting", 1800.0),
    ]


async def test_a_queued_job_is_estimated_to_start_when_the_running_one_should_end(
    db_url: str, pool: asyncpg.Pool, store: EventStore, tokens: Tokens
) -> None:
    runner = ProjectionRunner(pool, store, LogListener(db_url), [JobsProjection()])
    recorder = PendingRecorder(pool, store)
    jobs = Jobs(store)
    await Nodes(pool, store).register(
        NodeSpec("n1", uuid4(), "process", 8, 65536, gpus("n1", 1)), 60
    )
    manifest = JobManifest.model_validate(MANIFEST)
    acme = Metadata(actor="tenant:acme", tenant="acme")
    releases = Releases(pool, "n1")

    async def queued(job_id: UUID) -> None:
        async def shown() -> bool:  # the queue may show it a moment later (see above)
            await runner.catch_up(JobsProjection())
            query = "SELECT state FROM job_status WHERE job_id = $1"
            return await pool.fetchval(query, job_id) == "QUEUED"

        await eventually(shown)

    async def run_one() -> Claim:
        submitted, _ = await jobs.submit("acme", manifest, acme)
        await queued(submitted.job_id)
        [claimed] = await claim(pool, store, "n1")
        return claimed

    done = await run_one()  # one run of "train" that took about a second
    await asyncio.sleep(1.0)
    now = datetime.now(UTC)
    await jobs.execute(done.job.job_id, EnterPhase(JobStatus.PROCESSING, now, 1), acme)
    await jobs.execute(done.job.job_id, Complete([0], now, attempt=1), acme)
    await releases.release(done.job.job_id, 1)
    running = await run_one()
    waiting, _ = await jobs.submit("acme", manifest, acme)
    await queued(waiting.job_id)
    await recorder.record()

    loaded = await jobs.load(waiting.job_id)
    assert loaded is not None
    view = _json(await pending_view(pool, loaded, datetime.now(UTC)))
    assert [r["reason"] for r in view["reasons"]] == ["resources"]
    async with pool.acquire() as conn:
        took = await conn.fetchval(
            "SELECT released_at - allocated_at FROM allocations WHERE job_id = $1",
            done.job.job_id,
        )
        began = await conn.fetchval(
            "SELECT allocated_at FROM allocations WHERE job_id = $1", running.job.job_id
        )
    assert datetime.fromisoformat(view["estimated_start"]) == began + took


async def test_a_new_job_is_shown_at_once_and_its_history_follows_at_the_recording_pace(
    db_url: str, pool: asyncpg.Pool, store: EventStore
) -> None:
    """Rounds come often, so that a change shows within a second; the history a change adds
    (an event the `pending` projection applies, a write a claim competes with) waits for the
    next recording round (RECORDING), however many rounds come first."""
    start = datetime(2026, 11, 27, 9, 50, tzinfo=UTC)
    clock = ManualClock(start)
    runner = ProjectionRunner(pool, store, LogListener(db_url), [JobsProjection()])
    recorder = PendingRecorder(pool, store, clock=clock)
    jobs = Jobs(store, clock)
    acme = Metadata(actor="tenant:acme", tenant="acme")
    manifest = JobManifest.model_validate(MANIFEST)

    async def queued(job_id: UUID) -> None:
        async def shown() -> bool:
            await runner.catch_up(JobsProjection())
            query = "SELECT state FROM job_status WHERE job_id = $1"
            return bool(await pool.fetchval(query, job_id) == "QUEUED")

        await eventually(shown)

    async def reasons(job_id: UUID) -> list[str] | None:
        row = await pool.fetchrow("SELECT kinds FROM pending_reasons WHERE job_id = $1", job_id)
        return None if row is None else list(row["kinds"])

    first, _ = await jobs.submit("acme", manifest, acme)
    await queued(first.job_id)
    assert await recorder.record() > 0  # the first round records
    assert await store.version(pending_stream(first.job_id)) == 1

    clock.advance(timedelta(seconds=1))
    second, _ = await jobs.submit("acme", manifest, acme)
    await queued(second.job_id)
    assert await recorder.record() == 1
    assert await reasons(second.job_id) == ["no_nodes"]  # shown at once
    assert await store.version(pending_stream(second.job_id)) == 0  # not recorded yet
    assert await recorder.record() == 0  # nothing new to show, and not time to record

    clock.advance(timedelta(seconds=1))  # RECORDING after the first round
    assert await recorder.record() == 1
    assert await store.version(pending_stream(second.job_id)) == 1
    changed = [e.event for e in await store.read_stream(pending_stream(second.job_id))]
    assert changed[0].at == start + timedelta(seconds=1)  # type: ignore[attr-defined]


async def test_a_round_holds_no_snapshot_while_it_judges_and_yields_to_a_replica_that_wrote(
    db_url: str,
    pool: asyncpg.Pool,
    store: EventStore,
    owner: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round reads in one transaction and writes in another, judging in between in none (an
    open one would keep the row versions the claims leave behind from being pruned); a replica
    that wrote meanwhile wins, and the round that read before it writes nothing."""
    runner = ProjectionRunner(pool, store, LogListener(db_url), [JobsProjection()])
    jobs = Jobs(store)
    acme = Metadata(actor="tenant:acme", tenant="acme")
    manifest = JobManifest.model_validate(MANIFEST)
    queued = [(await jobs.submit("acme", manifest, acme))[0].job_id for _ in range(2)]

    async def all_queued() -> bool:
        await runner.catch_up(JobsProjection())
        query = "SELECT count(*) FROM job_status WHERE state = 'QUEUED'"
        return bool(await pool.fetchval(query) == len(queued))

    await eventually(all_queued)
    judging, go = threading.Event(), threading.Event()
    decided = recorder_module._decided

    def held(*args: Any) -> Any:
        judging.set()
        go.wait(10)
        return decided(*args)

    monkeypatch.setattr(recorder_module, "_decided", held)
    first = asyncio.create_task(PendingRecorder(pool, store).record())
    await asyncio.to_thread(judging.wait, 10)
    snapshots = """SELECT count(*) FROM pg_stat_activity
                   WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
                     AND datname = current_database() AND backend_type = 'client backend'"""
    assert await owner.fetchval(snapshots) == 0
    monkeypatch.setattr(recorder_module, "_decided", decided)
    replica = PendingRecorder(pool, store)
    assert await replica.record() == len(queued)
    go.set()
    assert await first == 0  # its read is older than the replica's write
    for job_id in queued:
        assert await store.version(pending_stream(job_id)) == 1  # recorded once, by the replica
    assert await owner.fetchval("SELECT round FROM pending_rounds") == 1  # one round wrote
