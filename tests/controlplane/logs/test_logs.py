"""Learner logs on a real Postgres: batched writes read back in order, idempotent resumes, a
cursor that never skips a late commit, long lines split with a marker, the shipper's bounded
buffer, and `GET /v1/jobs/{id}/logs` as text and as SSE with Last-Event-ID resume."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from controlplane.agent_port.postgres import PostgresPort
from controlplane.clock import SYSTEM_CLOCK
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.http.app import create_app
from controlplane.http.logs import LOG_FEEDS, LOG_FOLLOWER_LINES, LOG_POLL_S, LOG_SETTLE_S
from controlplane.jobs.lifecycle import Cancel, JobStatus
from controlplane.jobs.service import Jobs
from controlplane.logs.application import PAGE
from controlplane.logs.feeds import LAGGED, End, Lines
from controlplane.logs.lines import (
    CONTINUES,
    MAX_LINE,
    LogLine,
    Stream,
    is_storable,
    split_long_line,
    storable,
)
from controlplane.logs.store import last_seqs, read_lines, write_lines
from node_agent.log_shipper import LINE_OVERHEAD, LogShipper
from runners import protocol
from tests.polling import eventually
from tests.tenancy import Tokens, auth

Client = TestClient[Any, Any]
MANIFEST = {"name": "logs", "image": "img", "command": ["train"], "learners": 2}
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def line(
    job_id: UUID,
    seq: int,
    *,
    attempt: int = 1,
    learner: int = 0,
    stream: Stream = Stream.STDOUT,
    text: str | None = None,
) -> LogLine:
    return LogLine(
        job_id=job_id,
        attempt=attempt,
        learner=learner,
        stream=stream,
        seq=seq,
        at=T0 + timedelta(milliseconds=seq),
        text=f"{stream} of learner {learner}: line {seq}" if text is None else text,
    )


def texts(lines: list[LogLine]) -> list[str]:
    return [x.text for x in lines]


# Splitting and cleaning: pure functions.


@given(st.text(max_size=300), st.integers(min_value=len(CONTINUES) + 1, max_value=80))
def test_a_split_line_loses_nothing_and_marks_every_piece_that_continues(
    text: str, limit: int
) -> None:
    pieces = split_long_line(text, limit)
    assert all(len(piece) <= limit for piece in pieces)
    assert all(piece.endswith(CONTINUES) for piece in pieces[:-1])
    assert "".join(piece[: -len(CONTINUES)] for piece in pieces[:-1]) + pieces[-1] == text
    if len(text) <= limit:
        assert pieces == [text]


def test_split_refuses_a_limit_the_marker_does_not_fit_in() -> None:
    with pytest.raises(ValueError, match="limit must exceed"):
        split_long_line("x" * 100, len(CONTINUES))


@given(st.text())
def test_storable_text_is_what_postgres_holds_and_changes_only_what_it_must(text: str) -> None:
    cleaned = storable(text)
    assert is_storable(cleaned)
    assert len(cleaned) == len(text)
    if is_storable(text):
        assert cleaned == text


def test_a_line_is_refused_where_it_is_made_not_by_the_batch_it_would_fail() -> None:
    job = uuid4()
    with pytest.raises(ValueError, match="split it"):
        line(job, 1, text="x" * (MAX_LINE + 1))
    with pytest.raises(ValueError, match="NUL"):
        line(job, 1, text="a\0b")
    with pytest.raises(ValueError, match="start at 1"):
        line(job, 0)
    with pytest.raises(ValueError, match="time zone"):
        LogLine(job, 1, 0, Stream.STDOUT, 1, datetime(2024, 1, 1), "naive")
    with pytest.raises(ValueError, match="must be a Stream"):
        LogLine(job, 1, 0, "stdout", 1, T0, "plain str")  # type: ignore[arg-type]


# The store.


async def test_lines_come_back_in_the_order_stored_with_every_field(pool: asyncpg.Pool) -> None:
    job = uuid4()
    first = [
        line(job, 1),
        line(job, 1, stream=Stream.STDERR, text="naïve ☃ \t tabs and \r returns"),
        line(job, 2),
        line(job, 1, learner=1),
    ]
    second = [line(job, 3), line(job, 2, learner=1), line(job, 1, stream=Stream.SYSTEM)]
    assert await write_lines(pool, first) == 4
    assert await write_lines(pool, second) == 3
    assert await write_lines(pool, []) == 0

    stored = await read_lines(pool, job)
    assert [s.line for s in stored] == first + second
    ids = [s.id for s in stored]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # Pages: resuming after any id gives exactly the rest.
    page = await read_lines(pool, job, limit=3)
    rest = await read_lines(pool, job, after=page[-1].id)
    assert page + rest == stored
    assert await read_lines(pool, uuid4()) == []


async def test_filters_by_attempt_and_learner(pool: asyncpg.Pool) -> None:
    job = uuid4()
    batch = [
        line(job, seq, attempt=attempt, learner=learner)
        for seq in (1, 2)
        for attempt in (1, 2)
        for learner in (0, 1)
    ]
    await write_lines(pool, batch)

    def chosen(attempt: int | None, learner: int | None) -> list[LogLine]:
        return [x for x in batch if attempt in (None, x.attempt) and learner in (None, x.learner)]

    for attempt in (None, 1, 2, 3):
        for learner in (None, 0, 1):
            got = await read_lines(pool, job, attempt=attempt, learner=learner)
            assert [s.line for s in got] == chosen(attempt, learner), (attempt, learner)


async def test_a_retried_batch_or_a_resumed_agent_stores_no_line_twice(
    pool: asyncpg.Pool,
) -> None:
    job = uuid4()
    assert await last_seqs(pool, job, 1) == {}
    await write_lines(pool, [line(job, seq) for seq in range(1, 6)])
    await write_lines(pool, [line(job, 1, learner=1, stream=Stream.STDERR)])
    # A batch whose commit was not acknowledged is sent again, with more lines after it.
    assert await write_lines(pool, [line(job, seq) for seq in range(3, 9)]) == 3
    assert await write_lines(pool, [line(job, seq) for seq in range(3, 9)]) == 0
    resume = await last_seqs(pool, job, 1)
    assert resume == {(0, Stream.STDOUT): 8, (1, Stream.STDERR): 1}
    assert await last_seqs(pool, job, 2) == {}

    # A restarted agent numbers on from the stored seqs: no gap, no duplicate.
    after_restart = resume[(0, Stream.STDOUT)] + 1
    await write_lines(pool, [line(job, seq) for seq in range(after_restart, after_restart + 3)])
    stdout = [s.line.seq for s in await read_lines(pool, job, learner=0)]
    assert stdout == list(range(1, 12))


async def test_seqs_must_increase_within_a_batch(pool: asyncpg.Pool) -> None:
    job = uuid4()
    with pytest.raises(ValueError, match="goes from 2 to 2"):
        await write_lines(pool, [line(job, 1), line(job, 2), line(job, 2)])
    assert await read_lines(pool, job) == []


async def test_a_long_line_is_stored_in_marked_pieces_that_join_to_it(pool: asyncpg.Pool) -> None:
    job = uuid4()
    original = "".join(f"{i:06d}é" for i in range(6000))  # 42,000 characters
    pieces = split_long_line(original)
    assert len(pieces) == 3
    await write_lines(pool, [line(job, seq, text=p) for seq, p in enumerate(pieces, start=1)])
    stored = [s.line.text for s in await read_lines(pool, job)]
    assert stored == pieces
    assert "".join(p.removesuffix(CONTINUES) for p in stored) == original


async def test_writers_of_one_job_take_turns_so_the_cursor_never_skips_a_late_commit(
    pool: asyncpg.Pool,
) -> None:
    job = uuid4()
    async with pool.acquire() as slow:
        transaction = slow.transaction()
        await transaction.start()
        await write_lines(slow, [line(job, 1, learner=0), line(job, 2, learner=0)])
        # Another learner's batch, from another connection, while the first is uncommitted.
        fast = asyncio.create_task(write_lines(pool, [line(job, 1, learner=1)]))
        await asyncio.sleep(0.3)
        assert not fast.done(), "a second writer of the job must wait for the first to commit"
        assert await read_lines(pool, job) == []
        await transaction.commit()
        await fast
    stored = await read_lines(pool, job)
    assert [(s.line.learner, s.line.seq) for s in stored] == [(0, 1), (0, 2), (1, 1)]
    assert [s.id for s in stored] == sorted(s.id for s in stored)


async def test_a_reader_following_concurrent_writers_sees_every_line_once(
    pool: asyncpg.Pool,
) -> None:
    job, other = uuid4(), uuid4()
    learners, batches, size = 4, 15, 20

    async def learner_writes(learner: int) -> None:
        for b in range(batches):
            seqs = range(b * size + 1, (b + 1) * size + 1)
            # Some batches span two jobs, in either order: heads are locked in one order.
            extra = [line(other, b + 1, learner=learner)] if b % 3 == 0 else []
            batch = [line(job, seq, learner=learner) for seq in seqs]
            await write_lines(pool, extra + batch if learner % 2 else batch + extra)

    seen: list[tuple[int, int, int]] = []

    async def follow(done: asyncio.Event) -> None:
        cursor = 0
        while True:
            finished = done.is_set()  # read before the last look, so nothing is left behind
            for stored in await read_lines(pool, job, after=cursor, limit=50):
                seen.append((stored.id, stored.line.learner, stored.line.seq))
                cursor = stored.id
            if finished:
                return
            await asyncio.sleep(0.001)

    done = asyncio.Event()
    reader = asyncio.create_task(follow(done))
    await asyncio.gather(*(learner_writes(n) for n in range(learners)))
    done.set()
    await reader

    assert len(seen) == len(set(seen)) == learners * batches * size
    assert [s[0] for s in seen] == sorted(s[0] for s in seen)
    for learner in range(learners):
        seqs = [seq for _, n, seq in seen if n == learner]
        assert seqs == list(range(1, batches * size + 1))


# The shipper.


async def test_the_shipper_stores_every_line_in_order_and_ships_the_rest_on_stop(
    pool: asyncpg.Pool,
) -> None:
    job = uuid4()
    shipper = LogShipper(PostgresPort(pool), batch_lines=7, flush_interval_s=0.05)
    running = asyncio.create_task(shipper.run())
    lines = [
        line(job, seq, learner=seq % 3, stream=Stream.STDOUT if seq % 2 else Stream.STDERR)
        for seq in range(1, 101)
    ]
    for x in lines[:60]:
        shipper.add(x)
    await asyncio.sleep(0.2)
    for x in lines[60:]:
        shipper.add(x)
    shipper.stop()
    await asyncio.wait_for(running, 5)
    assert shipper.pending == 0 and shipper.dropped == 0
    assert [s.line for s in await read_lines(pool, job)] == lines


async def test_a_hurried_shipper_stores_its_lines_without_waiting_for_its_interval(
    pool: asyncpg.Pool,
) -> None:
    job = uuid4()
    shipper = LogShipper(PostgresPort(pool), flush_interval_s=600)
    running = asyncio.create_task(shipper.run())
    try:
        lines = [line(job, seq) for seq in range(1, 4)]
        for x in lines:
            shipper.add(x)
        shipper.hurry()

        async def stored() -> bool:
            return shipper.pending == 0

        await eventually(stored, seconds=10)
        assert [s.line for s in await read_lines(pool, job)] == lines
    finally:
        shipper.stop()
        await asyncio.wait_for(running, 5)


async def test_a_slow_database_never_blocks_the_shipper_and_dropped_lines_leave_a_marker(
    pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    job = uuid4()
    size = len(line(job, 1).text) + LINE_OVERHEAD
    shipper = LogShipper(
        PostgresPort(pool), batch_lines=100, flush_interval_s=0.02, job_buffer_chars=5 * size
    )
    running = asyncio.create_task(shipper.run())
    shipper.add(line(job, 1))
    await shipper.flush()

    # The database stalls: the job's log head stays locked by another transaction.
    stall = owner.transaction()
    await stall.start()
    await owner.execute("SELECT 1 FROM job_log_heads WHERE job_id = $1 FOR UPDATE", job)
    for seq in range(2, 21):
        shipper.add(line(job, seq))  # returns at once, the buffer full or not
    assert shipper.pending == 5 and shipper.dropped == 14
    await stall.rollback()

    for _ in range(100):
        if shipper.pending == 0:
            break
        await asyncio.sleep(0.02)
    shipper.add(line(job, 21))
    shipper.stop()
    await asyncio.wait_for(running, 5)

    stored = [s.line for s in await read_lines(pool, job)]
    assert [x.seq for x in stored] == [1, 2, 3, 4, 5, 6, 20, 21]
    assert stored[6].text == "[trainyard] 14 lines dropped (seqs 7-20): log storage fell behind"


async def test_the_shipper_retries_while_the_database_refuses_and_gives_up_only_at_stop(
    pool: asyncpg.Pool, owner: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    job = uuid4()
    shipper = LogShipper(
        PostgresPort(pool), flush_interval_s=0.02, retry_s=0.05, stop_timeout_s=0.3
    )
    running = asyncio.create_task(shipper.run())
    await owner.execute("REVOKE INSERT ON job_logs FROM trainyard_app")
    shipper.add(line(job, 1))
    shipper.add(line(job, 2))
    await asyncio.sleep(0.3)
    assert shipper.pending == 2  # kept through the failed tries
    await owner.execute("GRANT INSERT ON job_logs TO trainyard_app")
    for _ in range(100):
        if shipper.pending == 0:
            break
        await asyncio.sleep(0.02)
    assert [s.line.seq for s in await read_lines(pool, job)] == [1, 2]

    await owner.execute("REVOKE INSERT ON job_logs FROM trainyard_app")
    shipper.add(line(job, 3))
    shipper.stop()
    await asyncio.wait_for(running, 2)  # gives up after stop_timeout_s, and says so
    assert shipper.pending == 1
    assert "log shipper stopped with 1 line(s) not stored" in caplog.text


# The HTTP API.


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    app = create_app(db_url, poll_interval=0.2, sse_heartbeat_s=0.2)
    app[LOG_SETTLE_S] = 0.3
    app[LOG_POLL_S] = 0.05
    async with TestClient(TestServer(app)) as client:
        yield client


async def submit(client: Client, token: str) -> UUID:
    response = await client.post("/v1/jobs", json=MANIFEST, headers=auth(token))
    assert response.status == 201, await response.text()
    return UUID((await response.json())["id"])


async def test_text_lists_every_line_with_its_origin_and_honours_filters(
    client: Client, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    job = await submit(client, tokens.acme)
    await write_lines(
        pool,
        [
            line(job, 1, text="starting"),
            line(job, 1, learner=1, stream=Stream.STDERR, text="warning: ☃"),
            line(job, 1, attempt=2, text="again"),
        ],
    )
    response = await client.get(f"/v1/jobs/{job}/logs", headers=auth(tokens.acme))
    assert response.status == 200
    assert response.content_type == "text/plain"
    assert await response.text() == (
        "[attempt 1 learner 0 stdout] starting\n"
        "[attempt 1 learner 1 stderr] warning: ☃\n"
        "[attempt 2 learner 0 stdout] again\n"
    )
    only = await client.get(f"/v1/jobs/{job}/logs?attempt=1&learner=1", headers=auth(tokens.acme))
    assert await only.text() == "[attempt 1 learner 1 stderr] warning: ☃\n"
    admin = await client.get(f"/v1/jobs/{job}/logs?attempt=2", headers=auth(tokens.admin))
    assert await admin.text() == "[attempt 2 learner 0 stdout] again\n"


async def test_text_pages_through_more_lines_than_one_read(
    client: Client, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    job = await submit(client, tokens.acme)
    count = PAGE * 2 + 3
    await write_lines(pool, [line(job, seq, text=str(seq)) for seq in range(1, count + 1)])
    body = await (await client.get(f"/v1/jobs/{job}/logs", headers=auth(tokens.acme))).text()
    assert body.splitlines() == [f"[attempt 1 learner 0 stdout] {n}" for n in range(1, count + 1)]


async def test_another_tenants_job_is_not_found_and_bad_parameters_are_400(
    client: Client, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    job = await submit(client, tokens.acme)
    await write_lines(pool, [line(job, 1, text="secret")])
    for url in (f"/v1/jobs/{job}/logs", f"/v1/jobs/{job}/logs?follow=true"):
        response = await client.get(url, headers=auth(tokens.globex))
        assert response.status == 404
        assert "secret" not in await response.text()
    assert (await client.get(f"/v1/jobs/{uuid4()}/logs", headers=auth(tokens.acme))).status == 404
    assert (await client.get("/v1/jobs/not-a-uuid/logs", headers=auth(tokens.acme))).status == 404
    assert (await client.get(f"/v1/jobs/{job}/logs")).status == 401

    bad: list[tuple[str, dict[str, str], str]] = [
        ("attempt=0", {}, "attempt"),
        ("attempt=first", {}, "attempt"),
        ("learner=-1", {}, "learner"),
        ("learner=1.5", {}, "learner"),
        ("follow=maybe", {}, "follow"),
        ("protocol=yes", {}, "protocol"),
        ("after=x", {}, "after"),
        ("follow=true", {"Last-Event-ID": "abc"}, "Last-Event-ID"),
        ("follow=true", {"Last-Event-ID": "-1"}, "Last-Event-ID"),
    ]
    for query, headers, field in bad:
        response = await client.get(
            f"/v1/jobs/{job}/logs?{query}", headers={**auth(tokens.acme), **headers}
        )
        assert response.status == 400, query
        body = await response.json()
        assert (body["status"], body["field"]) == (400, field)


@dataclass
class Message:
    event: str
    id: int | None
    data: dict[str, Any]


async def sse(response: aiohttp.ClientResponse) -> AsyncIterator[Message | None]:
    """The messages of an SSE body; None for each heartbeat comment."""
    fields: dict[str, str] = {}
    async for raw in response.content:
        text = raw.decode().rstrip("\n")
        if text.startswith(":"):
            yield None
        elif text:
            name, _, value = text.partition(": ")
            fields[name] = value
        elif fields:
            ident = int(fields["id"]) if "id" in fields else None
            yield Message(fields["event"], ident, json.loads(fields["data"]))
            fields = {}


async def take(response: aiohttp.ClientResponse, count: int) -> list[Message]:
    taken: list[Message] = []
    async for message in sse(response):
        if message is not None:
            taken.append(message)
        if len(taken) == count:
            break
    return taken


async def test_follow_resumes_after_last_event_id_and_ends_once_the_job_has_ended(
    client: Client, tokens: Tokens, pool: asyncpg.Pool, store: EventStore
) -> None:
    job = await submit(client, tokens.acme)
    headers = auth(tokens.acme)
    url = f"/v1/jobs/{job}/logs?follow=true"
    await write_lines(pool, [line(job, seq) for seq in range(1, 6)])

    response = await client.get(url, headers=headers)
    assert response.content_type == "text/event-stream"
    first = await take(response, 3)
    response.close()  # the client drops, having seen three lines

    await write_lines(pool, [line(job, seq, learner=1) for seq in range(1, 4)])
    response = await client.get(url, headers={**headers, "Last-Event-ID": str(first[-1].id)})
    missed = await take(response, 5)
    # Live lines, while the job runs: the stream stays open (heartbeats) and delivers them.
    await asyncio.sleep(0.5)
    await write_lines(pool, [line(job, seq) for seq in range(6, 8)])
    live = await take(response, 2)
    await Jobs(store).execute(
        job, Cancel(reason="enough", at=SYSTEM_CLOCK.now()), Metadata(actor="test")
    )
    # Last words of a learner being stopped, within the settle time: still delivered.
    await write_lines(pool, [line(job, 1, stream=Stream.SYSTEM, text="learner 0 stopped")])
    rest = [m async for m in sse(response) if m is not None]  # ends by itself

    lines = [m for m in first + missed + live + rest if m.event == "line"]
    stored = await read_lines(pool, job)
    # Every stored line exactly once, in order, across the reconnection.
    assert len(stored) == 5 + 3 + 2 + 1
    assert [m.id for m in lines] == [s.id for s in stored]
    assert [m.data["line"] for m in lines] == [s.line.text for s in stored]
    assert lines[0].data == {
        "attempt": 1,
        "learner": 0,
        "stream": "stdout",
        "seq": 1,
        "at": T0.replace(microsecond=1000).isoformat(),
        "line": "stdout of learner 0: line 1",
    }
    assert rest[-1] == Message("end", None, {"state": "CANCELLED", "last_id": stored[-1].id})


async def test_following_an_ended_job_sends_its_lines_and_ends_filtered_or_not(
    client: Client, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    job = await submit(client, tokens.acme)
    headers = auth(tokens.acme)
    await write_lines(pool, [line(job, 1), line(job, 1, learner=1), line(job, 2)])
    assert (await client.post(f"/v1/jobs/{job}/cancel", headers=headers)).status == 200
    await asyncio.sleep(0.3)  # the settle time passes

    response = await client.get(f"/v1/jobs/{job}/logs?follow=true", headers=headers)
    every = [m async for m in sse(response) if m is not None]
    assert [m.event for m in every] == ["line", "line", "line", "end"]

    response = await client.get(f"/v1/jobs/{job}/logs?follow=1&learner=1", headers=headers)
    one = [m async for m in sse(response) if m is not None]
    assert [(m.event, m.data.get("learner")) for m in one] == [("line", 1), ("end", None)]

    resumed = {**headers, "Last-Event-ID": str(every[2].id)}
    response = await client.get(f"/v1/jobs/{job}/logs?follow=true", headers=resumed)
    assert [m.event async for m in sse(response) if m is not None] == ["end"]


async def test_protocol_lines_are_left_out_unless_asked_for_as_text_and_followed(
    client: Client, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    job = await submit(client, tokens.acme)
    headers = auth(tokens.acme)
    metric = protocol.encode(protocol.Metric(at=T0, step=3, values={"loss": 0.5}))
    lookalike = protocol.PREFIX + "{not a report"
    await write_lines(
        pool,
        [
            line(job, 1, text="epoch 1"),
            line(job, 2, text=metric),
            line(job, 3, text=lookalike),
            line(job, 1, stream=Stream.STDERR, text=metric),  # only stdout carries reports
            line(job, 4, text=metric),
        ],
    )
    body = await (await client.get(f"/v1/jobs/{job}/logs", headers=headers)).text()
    assert body == (
        "[attempt 1 learner 0 stdout] epoch 1\n"
        f"[attempt 1 learner 0 stdout] {lookalike}\n"
        f"[attempt 1 learner 0 stderr] {metric}\n"
    )
    every = await client.get(f"/v1/jobs/{job}/logs?protocol=true", headers=headers)
    assert (await every.text()).count(metric) == 3

    assert (await client.post(f"/v1/jobs/{job}/cancel", headers=headers)).status == 200
    await asyncio.sleep(0.3)  # the settle time passes
    stored = await read_lines(pool, job)
    response = await client.get(f"/v1/jobs/{job}/logs?follow=true", headers=headers)
    shown = [m async for m in sse(response) if m is not None]
    assert [m.id for m in shown] == [stored[0].id, stored[2].id, stored[3].id, None]
    assert shown[-1].data["last_id"] == stored[-1].id  # past the left-out last line
    response = await client.get(f"/v1/jobs/{job}/logs?follow=true&protocol=1", headers=headers)
    assert len([m async for m in sse(response) if m is not None]) == 5 + 1


async def test_followers_of_a_job_share_one_reader_and_each_gets_every_line_once(
    client: Client, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    job = await submit(client, tokens.acme)
    headers = auth(tokens.acme)
    await write_lines(pool, [line(job, seq) for seq in range(1, 4)])
    feeds = client.app[LOG_FEEDS]

    async def follow() -> list[Message]:
        response = await client.get(f"/v1/jobs/{job}/logs?follow=true", headers=headers)
        return [m async for m in sse(response) if m is not None]

    followers = [asyncio.create_task(follow()) for _ in range(12)]

    async def all_following() -> bool:  # waited for: a loaded CI machine answers slowly
        return feeds.followers == 12

    await eventually(all_following)
    assert feeds.feeds == 1  # one reader for the job, however many follow it
    for seq in range(4, 40):
        await write_lines(pool, [line(job, seq)])
    assert (await client.post(f"/v1/jobs/{job}/cancel", headers=headers)).status == 200
    stored = await read_lines(pool, job)
    for received in await asyncio.gather(*followers):
        assert [m.id for m in received] == [s.id for s in stored] + [None]
        assert received[-1].data == {"state": "CANCELLED", "last_id": stored[-1].id}
    assert feeds.feeds == 0  # the reader stopped with its last follower


async def test_a_follower_that_falls_behind_reads_the_database_and_still_sees_the_end(
    db_url: str, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    app = create_app(db_url, poll_interval=0.2)
    app[LOG_SETTLE_S], app[LOG_POLL_S], app[LOG_FOLLOWER_LINES] = 0.3, 0.05, 5
    async with TestClient(TestServer(app)) as client:
        job = await submit(client, tokens.acme)
        with client.app[LOG_FEEDS].follow(job) as follower:
            for batch in range(3):  # each batch read on its own by the feed
                await write_lines(pool, [line(job, 4 * batch + n) for n in range(1, 5)])
                await asyncio.sleep(0.2)
            # The second batch would have exceeded its queue's 5 lines: the queue was emptied
            # (the reader never waits for a follower), and the follower is told so, once.
            assert await follower.next() is LAGGED
            await write_lines(pool, [line(job, seq) for seq in range(13, 15)])
            after = await follower.next()  # the feed's items come again
            assert isinstance(after, Lines) and [s.line.seq for s in after.lines] == [13, 14]
            # Behind again, and the log ends meanwhile: its end still comes, after LAGGED.
            await write_lines(pool, [line(job, seq) for seq in range(15, 21)])
            cancel = {"reason": "done"}
            headers = auth(tokens.acme)
            response = await client.post(f"/v1/jobs/{job}/cancel", json=cancel, headers=headers)
            assert response.status == 200
            await asyncio.sleep(1)  # past the settle time: the feed has ended
            assert await follower.next() is LAGGED
            end = await follower.next()
            assert end == End(JobStatus.CANCELLED, (await read_lines(pool, job))[-1].id)


async def test_following_a_cancelled_job_waits_until_its_learners_have_ended(
    client: Client, tokens: Tokens, pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    job = await submit(client, tokens.acme)
    headers = auth(tokens.acme)
    await owner.execute(
        "INSERT INTO allocations (job_id, attempt, learner, tenant, node, epoch, gpus, cpus,"
        " memory_mb) VALUES ($1, 1, 0, 'acme', 'n1', 1, '{GPU-1}', 1, 1024)",
        job,
    )
    await write_lines(pool, [line(job, 1, text="training")])
    response = await client.get(f"/v1/jobs/{job}/logs?follow=true", headers=headers)
    assert [m.data["line"] for m in await take(response, 1)] == ["training"]
    assert (await client.post(f"/v1/jobs/{job}/cancel", headers=headers)).status == 200

    # The learner takes longer than the settle time to stop, and has last words.
    await asyncio.sleep(1.0)
    await write_lines(pool, [line(job, 2, text="checkpoint saved")])
    await owner.execute("UPDATE allocations SET released_at = now() WHERE job_id = $1", job)
    rest = [m async for m in sse(response) if m is not None]
    assert [(m.event, m.data.get("line")) for m in rest] == [
        ("line", "checkpoint saved"),
        ("end", None),
    ]


async def test_logs_outlive_their_job_the_application_cannot_change_or_remove_them(
    pool: asyncpg.Pool,
) -> None:
    job = uuid4()
    await write_lines(pool, [line(job, 1)])
    for statement in ("DELETE FROM job_logs", "UPDATE job_logs SET line = ''", "TRUNCATE job_logs"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await pool.execute(statement)
    assert len(await read_lines(pool, job)) == 1


async def test_shutdown_ends_open_log_streams(db_url: str, tokens: Tokens) -> None:
    app = create_app(db_url, poll_interval=0.2, sse_heartbeat_s=5)
    server = TestServer(app)
    await server.start_server()
    async with aiohttp.ClientSession(headers=auth(tokens.acme)) as session:
        async with session.post(server.make_url("/v1/jobs"), json=MANIFEST) as response:
            job = (await response.json())["id"]
        url = server.make_url(f"/v1/jobs/{job}/logs?follow=true")
        async with session.get(url) as response:
            closing = asyncio.create_task(server.close())
            # The open stream ends, cleanly and promptly, without an `end` event: the job has
            # not ended, and the client should resume elsewhere.
            rest = await asyncio.wait_for(asyncio.shield(_collect(sse(response))), timeout=5)
            assert [m for m in rest if m is not None] == []
            await asyncio.wait_for(closing, 10)


async def _collect(messages: AsyncIterator[Message | None]) -> list[Message | None]:
    return [m async for m in messages]
