"""`GET /v1/logs/search`: a tenant's lines across its jobs and attempts, newest first; never
another tenant's; filters; cursor pages without gaps or repeats while lines keep arriving;
malformed patterns are a 400 naming `pattern`, never a 500; a follow ends at the shutdown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.database import AGENT_ROLE, connect
from controlplane.http.app import create_app
from controlplane.http.keys import POOL
from controlplane.http.log_search import FOLLOW_POLL_S, FOLLOW_SETTLE_S
from controlplane.logs.lines import LogLine, Stream
from controlplane.logs.store import write_lines
from tests.polling import eventually
from tests.tenancy import Tokens, auth

Client = TestClient[Any, Any]
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    app = create_app(db_url)
    # Lines are stored at once here: the follow need not wait for agents' flushes.
    app[FOLLOW_SETTLE_S] = 0.2
    app[FOLLOW_POLL_S] = 0.05
    async with TestClient(TestServer(app)) as client:
        yield client


async def submit(client: Client, token: str, labels: dict[str, str] | None = None) -> UUID:
    manifest = {"name": "grep", "image": "img", "command": ["train"], "labels": labels or {}}
    response = await client.post("/v1/jobs", json=manifest, headers=auth(token))
    assert response.status == 201, await response.text()
    job_id = UUID((await response.json())["id"])
    pool: asyncpg.Pool = client.app[POOL]

    async def projected() -> bool:
        return bool(await pool.fetchval("SELECT 1 FROM job_status WHERE job_id = $1", job_id))

    await eventually(projected)  # lines carry the tenant job_status knows
    return job_id


def line(job: UUID, seq: int, text: str, *, minute: float, attempt: int = 1) -> LogLine:
    return LogLine(
        job_id=job,
        attempt=attempt,
        learner=seq % 2,
        stream=Stream.STDOUT if seq % 3 else Stream.STDERR,
        seq=seq,
        at=T0 + timedelta(minutes=minute),
        text=text,
    )


async def grep(client: Client, token: str, status: int = 200, **query: Any) -> Any:
    response = await client.get("/v1/logs/search", params=query, headers=auth(token))
    assert response.status == status, await response.text()
    return await response.json()


async def test_a_tenant_finds_its_own_lines_newest_first_across_jobs_and_attempts(
    client: Client, tokens: Tokens
) -> None:
    pool = client.app[POOL]
    first, second = await submit(client, tokens.acme), await submit(client, tokens.acme)
    theirs = await submit(client, tokens.globex)
    await write_lines(pool, [line(first, 1, "CUDA out of memory", minute=1)])
    await write_lines(pool, [line(first, 1, "cuda OUT of memory again", minute=5, attempt=2)])
    await write_lines(pool, [line(second, 1, "epoch 1 out of memory", minute=3)])
    await write_lines(pool, [line(second, 2, "all fine", minute=4)])
    await write_lines(pool, [line(theirs, 1, "globex out of memory", minute=6)])

    found = await grep(client, tokens.acme, pattern="out of memory")
    assert [(x["line"], x["attempt"]) for x in found["lines"]] == [
        ("epoch 1 out of memory", 1),
        ("CUDA out of memory", 1),
    ]
    assert found["next_cursor"] is None
    newest = found["lines"][0]
    assert newest["job_id"] == str(second) and newest["learner"] == 1
    assert newest["stream"] == "stdout" and newest["seq"] == 1
    assert datetime.fromisoformat(newest["at"]) == T0 + timedelta(minutes=3)

    insensitive = await grep(client, tokens.acme, pattern="OUT OF", ignore_case="true")
    assert [x["attempt"] for x in insensitive["lines"]] == [2, 1, 1]

    # Neither by substring nor by regular expression does one tenant see another's lines.
    assert not (await grep(client, tokens.acme, pattern="globex"))["lines"]
    assert not (await grep(client, tokens.acme, pattern="^glob.x", regex="true"))["lines"]
    assert len((await grep(client, tokens.globex, pattern="memory"))["lines"]) == 1
    assert not (await grep(client, tokens.globex, pattern="CUDA|epoch", regex="true"))["lines"]
    # The admin searches for a named tenant.
    assert len((await grep(client, tokens.admin, pattern="memory", tenant="globex"))["lines"]) == 1
    await grep(client, tokens.admin, 400, pattern="memory")
    await grep(client, tokens.acme, 403, pattern="memory", tenant="globex")


async def test_regular_expressions_filters_and_punctuation(client: Client, tokens: Tokens) -> None:
    pool = client.app[POOL]
    tagged = await submit(client, tokens.acme, {"team": "vision"})
    other = await submit(client, tokens.acme, {"team": "nlp"})
    await write_lines(
        pool,
        [
            line(tagged, 1, "loss=0.25 (step 10)", minute=1),
            line(tagged, 2, "loss=0.125 (step 20)", minute=2),
            line(tagged, 4, '@@trainyard/1 {"kind":"metric","loss":1}', minute=2.5),
        ],
    )
    await write_lines(pool, [line(other, 1, "loss=0.5 (step 10)", minute=3)])

    # A substring is literal: its dot and parentheses are no regular expression.
    assert len((await grep(client, tokens.acme, pattern="0.25 (step"))["lines"]) == 1
    assert not (await grep(client, tokens.acme, pattern="0x25"))["lines"]
    regex = await grep(client, tokens.acme, pattern=r"loss=0\.[0-9]{3}", regex="true")
    assert [x["line"] for x in regex["lines"]] == ["loss=0.125 (step 20)"]

    by_job = await grep(client, tokens.acme, pattern="loss", job=str(other))
    assert [x["job_id"] for x in by_job["lines"]] == [str(other)]
    by_label = await grep(client, tokens.acme, pattern="loss", label="team=vision")
    assert {x["job_id"] for x in by_label["lines"]} == {str(tagged)}
    assert len(by_label["lines"]) == 2  # the launcher's report is left out by default
    with_protocol = await grep(
        client, tokens.acme, pattern="loss", label="team=vision", protocol="true"
    )
    assert len(with_protocol["lines"]) == 3
    since = (T0 + timedelta(minutes=2)).isoformat()
    recent = await grep(client, tokens.acme, pattern="loss", since=since)
    assert [x["line"] for x in recent["lines"]] == ["loss=0.5 (step 10)", "loss=0.125 (step 20)"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"pattern": "(unclosed", "regex": "true"}, "pattern"),
        ({"pattern": "a{2,1}", "regex": "true"}, "pattern"),
        ({"pattern": "x\\", "regex": "true"}, "pattern"),
        ({"pattern": "\\Aanchored", "regex": "true"}, "pattern"),
        ({"pattern": ""}, "pattern"),
        ({"pattern": "x" * 501}, "pattern"),
        ({"pattern": "a\nb"}, "pattern"),
        ({"pattern": "nul\x00"}, "pattern"),
        ({}, "pattern"),
        ({"pattern": "x", "regex": "maybe"}, "regex"),
        ({"pattern": "x", "job": "not-a-uuid"}, "job"),
        ({"pattern": "x", "label": "novalue"}, "label"),
        ({"pattern": "x", "since": "yesterday"}, "since"),
        ({"pattern": "x", "limit": "0"}, "limit"),
        ({"pattern": "x", "cursor": "garbage"}, "cursor"),
    ],
)
async def test_malformed_searches_are_400_naming_the_field(
    client: Client, tokens: Tokens, query: dict[str, Any], field: str
) -> None:
    job = await submit(client, tokens.acme)
    # Lines to test a pattern against, so that Postgres compiles it either way.
    await write_lines(client.app[POOL], [line(job, 1, "anything", minute=1)])
    body = await grep(client, tokens.acme, 400, **query)
    assert body["field"] == field


async def test_pages_neither_repeat_nor_skip_while_lines_arrive(
    client: Client, tokens: Tokens
) -> None:
    pool = client.app[POOL]
    jobs = [await submit(client, tokens.acme) for _ in range(3)]
    # The same minute for several lines: the order's ties are broken by job and id.
    for n, job in enumerate(jobs):
        await write_lines(
            pool, [line(job, seq, f"step {seq} of job {n}", minute=seq // 2) for seq in range(1, 9)]
        )
    seen: list[tuple[str, int]] = []
    cursor = None
    while True:
        query: dict[str, Any] = {
            "pattern": "step",
            "limit": "5",
            **({"cursor": cursor} if cursor else {}),
        }
        page = await grep(client, tokens.acme, **query)
        seen += [(x["job_id"], x["id"]) for x in page["lines"]]
        # Lines stored meanwhile, newer than any: above the cursor, no later page shows them.
        job = jobs[len(seen) % 3]
        seq = 100 + len(seen)
        await write_lines(pool, [line(job, seq, "step late", minute=60)])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 24
    everything = await grep(client, tokens.acme, pattern="step", limit="1000")
    order = [(datetime.fromisoformat(x["at"]), x["job_id"], x["id"]) for x in everything["lines"]]
    assert order == sorted(order, reverse=True)


async def test_an_agent_cannot_file_a_line_under_another_tenant(
    client: Client, tokens: Tokens, db_url: str
) -> None:
    job = await submit(client, tokens.acme)
    # The owner's agents (unconfined by 0032) still may not forge the tenant.
    conn = await connect(db_url, role=AGENT_ROLE)
    try:
        record = (job, 1, 0, "stdout", 1, 1, T0, "forged", "globex")
        columns = ("job_id", "attempt", "learner", "stream", "seq", "id", "at", "line", "tenant")
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="tenant"):
            await conn.copy_records_to_table("job_logs", records=[record], columns=columns)
        assert await write_lines(conn, [line(job, 1, "honest", minute=1)]) == 1
    finally:
        await conn.close()
    assert len((await grep(client, tokens.acme, pattern="honest"))["lines"]) == 1


async def followed(response: aiohttp.ClientResponse, count: int) -> list[tuple[str, Any]]:
    """The first `count` lines of a followed search, as (SSE id, data)."""
    taken: list[tuple[str, Any]] = []
    fields: dict[str, str] = {}
    async with asyncio.timeout(20):
        async for raw in response.content:
            text = raw.decode().rstrip("\n")
            if text and not text.startswith(":"):
                name, _, value = text.partition(": ")
                fields[name] = value
            elif not text and fields:
                assert fields["event"] == "line"
                taken.append((fields["id"], json.loads(fields["data"])))
                fields = {}
                if len(taken) == count:
                    return taken
    raise AssertionError(f"the stream ended after {len(taken)} lines")


async def test_follow_sends_new_matching_lines_and_resumes_by_last_event_id(
    client: Client, tokens: Tokens
) -> None:
    pool = client.app[POOL]
    job, theirs = await submit(client, tokens.acme), await submit(client, tokens.globex)
    await write_lines(pool, [line(job, 1, "error: before the follow", minute=0)])
    query = {"pattern": "error", "follow": "true"}
    async with client.get("/v1/logs/search", params=query, headers=auth(tokens.acme)) as stream:
        assert stream.status == 200
        assert stream.headers["Content-Type"] == "text/event-stream"
        now = datetime.now(UTC)
        await write_lines(
            pool,
            [
                LogLine(job, 1, 0, Stream.STDERR, 2, now, "error: first"),
                LogLine(job, 1, 0, Stream.STDERR, 3, now, "fine"),
                LogLine(job, 1, 0, Stream.STDERR, 4, now, "error: second"),
            ],
        )
        await write_lines(pool, [LogLine(theirs, 1, 0, Stream.STDERR, 1, now, "error: globex")])
        (first_id, first), (_, second) = await followed(stream, 2)
    assert (first["line"], second["line"]) == ("error: first", "error: second")
    assert first["job_id"] == str(job) and first["stream"] == "stderr"

    # Resumed after the first line: the second again, then what came meanwhile; nothing else.
    later = datetime.now(UTC)
    await write_lines(pool, [LogLine(job, 2, 1, Stream.STDOUT, 1, later, "error: third")])
    headers = {**auth(tokens.acme), "Last-Event-ID": first_id}
    async with client.get("/v1/logs/search", params=query, headers=headers) as stream:
        resumed = await followed(stream, 2)
    assert [(x["line"], x["attempt"]) for _, x in resumed] == [
        ("error: second", 1),
        ("error: third", 2),
    ]

    bad = {**auth(tokens.acme), "Last-Event-ID": "nonsense"}
    response = await client.get("/v1/logs/search", params=query, headers=bad)
    assert response.status == 400
    assert (await response.json())["field"] == "Last-Event-ID"
    regex = {"pattern": "(", "regex": "true", "follow": "true"}
    response = await client.get("/v1/logs/search", params=regex, headers=auth(tokens.acme))
    assert response.status == 400
    assert (await response.json())["field"] == "pattern"


async def test_shutdown_ends_a_follow_at_once(db_url: str, tokens: Tokens) -> None:
    server = TestServer(create_app(db_url, sse_heartbeat_s=60))
    await server.start_server()
    query = {"pattern": "error", "follow": "true"}
    url = server.make_url("/v1/logs/search")
    async with (
        aiohttp.ClientSession(headers=auth(tokens.acme)) as session,
        session.get(url, params=query) as stream,
    ):
        assert stream.status == 200
        closing = asyncio.create_task(server.close())
        # The follow ends cleanly, long before a heartbeat would have found out.
        async with asyncio.timeout(5):
            assert [raw async for raw in stream.content if not raw.startswith(b":")] == []
        await asyncio.wait_for(closing, 10)
