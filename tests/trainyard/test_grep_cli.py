"""`trainyard grep` as a user runs it (a child process against a served control plane), and the
SDK's `grep` (both clients): the tenant's matching lines newest first with where they came from,
exit code 1 when nothing matched, 2 for a pattern the server refuses."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

import asyncpg
import pytest

from controlplane.logs.lines import LogLine, Stream
from controlplane.logs.store import write_lines
from harness.served import ServedControlPlane
from tests.polling import eventually
from tests.tenancy import Tokens
from tests.trainyard.test_client_cli import Cli
from tests.trainyard.test_models_cli import user
from trainyard import AsyncClient, Client
from trainyard.grep_command import parse_since

MANIFEST = {"name": "grep", "image": "img", "command": ["train"], "labels": {"team": "vision"}}


@pytest.fixture
async def cli(db_url: str, tokens: Tokens, tmp_path: Path) -> AsyncIterator[Cli]:
    served = ServedControlPlane(db_url, tmp_path / "server")
    await served.start()
    yield user(tmp_path, served.url, tokens.acme)
    await served.stop()


async def job_with_lines(
    cli: Cli, pool: asyncpg.Pool, token: str, texts: list[str], at: datetime
) -> str:
    async with AsyncClient(cli.env["TRAINYARD_SERVER"], token) as client:
        job_id = (await client.submit(MANIFEST))["id"]

    async def projected() -> bool:
        return bool(await pool.fetchval("SELECT 1 FROM job_status WHERE job_id = $1", job_id))

    await eventually(projected)
    lines = [
        LogLine(UUID(job_id), 1, 0, Stream.STDOUT, n, at + timedelta(seconds=n), text)
        for n, text in enumerate(texts, start=1)
    ]
    await write_lines(pool, lines)
    return str(job_id)


async def test_grep_prints_the_tenants_matching_lines_newest_first(
    cli: Cli, pool: asyncpg.Pool, tokens: Tokens
) -> None:
    at = datetime(2026, 11, 1, 12, tzinfo=UTC)
    first = await job_with_lines(cli, pool, tokens.acme, ["loading data", "CUDA out of memory"], at)
    second = await job_with_lines(cli, pool, tokens.acme, ["step 1: out of memory"], at)
    await job_with_lines(cli, pool, tokens.globex, ["globex out of memory"], at)

    found = await cli("grep", "out of memory")
    assert found.rc == 0, found.stderr
    assert found.stdout.splitlines() == [
        f"2026-11-01T12:00:02.000000Z {first} [attempt 1 learner 0 stdout] CUDA out of memory",
        f"2026-11-01T12:00:01.000000Z {second} [attempt 1 learner 0 stdout] step 1: out of memory",
    ]
    one = await cli("grep", "--regex", "^[A-Z]+ out", "--job", first, "--output", "json")
    assert one.rc == 0, one.stderr
    assert [json.loads(x)["line"] for x in one.stdout.splitlines()] == ["CUDA out of memory"]
    limited = await cli(
        "grep", "--ignore-case", "OUT OF MEMORY", "--label", "team=vision", "--limit", "1"
    )
    assert len(limited.stdout.splitlines()) == 1

    # Nothing matched: exit code 1, like grep; another tenant's lines never match.
    nothing = await cli("grep", "globex")
    assert nothing.rc == 1 and nothing.stdout == ""
    # Where the reports a person saw in `trainyard logs` went: --raw searches them.
    assert "searched with --raw" in nothing.stderr
    assert (await cli("grep", "memory", "--since", "2026-11-02T00:00:00Z")).rc == 1
    theirs = await cli("grep", "memory", TRAINYARD_TOKEN=tokens.globex)
    assert theirs.rc == 0 and "globex out of memory" in theirs.stdout
    assert "CUDA" not in theirs.stdout

    refused = await cli("grep", "--regex", "(unclosed")
    assert refused.rc == 2
    assert "regular expression" in refused.stderr
    assert (await cli("grep", "x", "--since", "yesterday")).rc == 2


async def test_both_clients_page_through_every_match(
    cli: Cli, pool: asyncpg.Pool, tokens: Tokens
) -> None:
    at = datetime(2026, 11, 1, 12, tzinfo=UTC)
    texts = [f"epoch {n} loss {n / 10}" for n in range(25)]
    job_id = await job_with_lines(cli, pool, tokens.acme, texts, at)
    server = cli.env["TRAINYARD_SERVER"]
    async with AsyncClient(server, tokens.acme) as client:
        found = [x async for x in client.grep("loss", page_size=10)]
    assert [x["line"] for x in found] == texts[::-1]
    assert {x["job_id"] for x in found} == {job_id}
    with Client(server, tokens.acme) as blocking:
        assert [x["line"] for x in blocking.grep(r"loss 0\.[0-4]$", regex=True)] == [
            f"epoch {n} loss {n / 10}" for n in range(4, -1, -1)
        ]


def test_since_takes_a_time_or_an_age() -> None:
    now = datetime(2026, 11, 1, 12, tzinfo=UTC)
    assert parse_since("10m", now) == now - timedelta(minutes=10)
    assert parse_since("2d", now) == now - timedelta(days=2)
    assert parse_since("2026-11-01T10:00:00+02:00", now) == datetime(2026, 11, 1, 8, tzinfo=UTC)
    assert parse_since(None, now) is None


async def test_the_sdk_follows_new_matching_lines(
    cli: Cli, pool: asyncpg.Pool, tokens: Tokens
) -> None:
    job_id = await job_with_lines(cli, pool, tokens.acme, ["before"], datetime.now(UTC))
    async with AsyncClient(cli.env["TRAINYARD_SERVER"], tokens.acme) as client:
        followed = client.grep("nan", follow=True)
        async with aclosing(followed):
            first = asyncio.create_task(anext(followed))
            # A new line, printed (by its time) after the follow started, even on a slow machine.
            await asyncio.sleep(1)
            now = datetime.now(UTC) + timedelta(seconds=3)
            lines = [
                LogLine(UUID(job_id), 1, 0, Stream.STDOUT, 2, now, "loss nan at step 7"),
                LogLine(UUID(job_id), 1, 0, Stream.STDOUT, 3, now, "loss 0.1"),
            ]
            await write_lines(pool, lines)
            async with asyncio.timeout(30):
                line = await first
    assert (line["job_id"], line["seq"], line["line"]) == (job_id, 2, "loss nan at step 7")
