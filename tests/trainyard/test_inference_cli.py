"""Inference jobs as a user runs them: `trainyard infer | stats | queries` subprocesses against
the control plane's app on a real Postgres, with a real agent whose replicas run the tenant's
model; the SDK's calls against it too; what the commands refuse before sending anything; and
how the SDK follows a stats stream that breaks off, against a stub server."""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from cli.main import main, parser
from controlplane.inference.spec import InferenceRequest
from tests.controlplane.deployments.serving import publish, serving_cluster
from tests.controlplane.inference.test_inference import SUMS
from tests.polling import eventually
from tests.tenancy import Tokens
from tests.trainyard.test_client_cli import Cli
from tests.trainyard.test_models_cli import user
from tests.trainyard.test_serving_cli import piped
from trainyard import AsyncClient, Client, UsageError
from trainyard.inference_commands import RESULT_CHARS, _result, stats_text

JOB = str(uuid.uuid4())


@pytest.fixture
async def cluster(db_url: str, tmp_path: Path, tokens: Tokens) -> AsyncIterator[Cli]:
    """`trainyard` as tenant acme, whose model `sums` is published, against the app of a
    serving cluster with one agent (its node: n1)."""
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "sums", SUMS, "sums:predict")
        yield user(tmp_path, str(client.make_url("")), tokens.acme)


@pytest.mark.processes
async def test_an_inference_job_is_submitted_followed_and_read(cluster: Cli) -> None:
    cli = cluster
    submitted = await cli(
        "infer",
        "noise",
        "--model",
        "sums",
        "--generate",
        "8",
        "--seed",
        "3",
        "--batch-size",
        "4",
        "--queries",
        "5",
        "--label",
        "suite=inference",
    )
    assert submitted.rc == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert str(uuid.UUID(job_id)) == job_id

    # Not a terminal: each update's table, the last one the job's end; exit 0 (COMPLETED).
    followed = await cli("stats", job_id, "--follow")
    assert followed.rc == 0, followed.stderr
    assert followed.stdout.startswith("job ")
    last = followed.stdout.rsplit("\n\njob ", 1)[-1]
    assert "COMPLETED" in last and "5 of 5 finished: 5 succeeded, 0 failed" in last, last

    shown = await cli("stats", job_id)
    assert shown.rc == 0, shown.stderr
    text = shown.stdout
    assert "COMPLETED" in text and "acme/sums:1, batches of 4 items, weight 1" in text
    assert "5 of 5 finished: 5 succeeded, 0 failed; 0 running, 0 queued, 0 retried" in text
    assert "latency" in text and "median" in text and "p99" in text
    header, row = text.split("\n\n", 1)[1].splitlines()
    assert header.split() == ["REPLICA", "NODE", "FINISHED", "RATE", "(10", "s)", "MEDIAN", "P99"]
    assert row.split()[1:3] == ["n1", "5"]

    figures = (await cli("stats", job_id, "--output", "json")).json()
    assert figures["state"] == "COMPLETED" and figures["total_queries"] == 5
    assert figures["queries"]["succeeded"] == 5 and figures["model"] == "acme/sums:1"
    assert figures["latency_ms"]["median"] > 0
    if figures.get("query_rate"):  # a server that gives IDunno's query rate
        assert "query rate" in text
    # Following a job that has ended: its final figures, one line, at once.
    lines = (await cli("stats", job_id, "--follow", "--output", "json")).stdout.splitlines()
    assert [json.loads(line)["queries"]["finished"] for line in lines] == [5]

    listed = await cli("queries", job_id)
    assert listed.rc == 0 and listed.stderr == "", listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["INDEX", "STATE", "NODE", "LATENCY", "MS", "TRIES", "RESULT"]
    assert [row.split()[:3] for row in rows] == [[str(n), "succeeded", "n1"] for n in range(5)]
    # jsonb's order of keys; four outputs are more than a line shows.
    assert all(row.split()[4] == "1" and '[{"n":8,"sum":' in row for row in rows), rows
    assert all(row.endswith("…") and len(row.split()[5]) == RESULT_CHARS for row in rows), rows
    page = (await cli("queries", job_id, "--after", "1", "--limit", "2", "--output", "json")).json()
    assert [q["index"] for q in page["queries"]] == [2, 3] and page["next_after"] == 3
    assert len(page["queries"][0]["outputs"]) == 4
    paged = await cli("queries", job_id, "--after", "1", "--limit", "2")
    assert [row.split()[0] for row in paged.stdout.splitlines()[1:]] == ["2", "3"]
    assert paged.stderr == f"more: trainyard queries {job_id} --after 3 --limit 2\n"

    # It is a job, listed with its labels; a job that is not there is exit code 4, a job id
    # that is not a UUID is a usage error.
    jobs = (await cli("list", "--label", "suite=inference", "--output", "json")).json()
    assert [job["id"] for job in jobs] == [job_id]
    assert (await cli("stats", str(uuid.uuid4()))).rc == 4
    assert (await cli("queries", "not-a-job")).rc == 2


@pytest.mark.processes
async def test_items_come_from_a_file_or_standard_input(cluster: Cli, tmp_path: Path) -> None:
    cli = cluster
    items = [[n, n + 1] for n in range(5)]
    path = tmp_path / "items.json"
    path.write_text(json.dumps(items))
    from_file = await cli(
        "infer", "given", "--model", "sums", "--items", f"@{path}", "--batch-size", "2"
    )
    assert from_file.rc == 0, from_file.stderr
    from_stdin = await piped(
        cli,
        json.dumps(items),
        "infer",
        "piped",
        "--model",
        "sums",
        "--items",
        "-",
        "--batch-size",
        "2",
        "--queries",
        "2",
        "--output",
        "json",
    )
    assert from_stdin.rc == 0, from_stdin.stderr
    job = from_stdin.json()
    assert job["manifest"]["inference"]["queries"] == 2
    for job_id, sums in ((from_file.stdout.strip(), 5), (job["id"], 4)):
        assert (await cli("stats", job_id, "--follow", "--output", "json")).rc == 0
        page = (await cli("queries", job_id, "--output", "json")).json()
        outputs = [o["sum"] for q in page["queries"] for o in q["outputs"]]
        assert outputs == [2 * n + 1 for n in range(sums)]


@pytest.mark.processes
async def test_following_an_endless_job_ends_when_it_is_cancelled(cluster: Cli) -> None:
    cli = cluster
    submitted = await cli("infer", "endless", "--model", "sums", "--generate", "4")
    assert submitted.rc == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    following = asyncio.create_task(cli("stats", job_id, "-f", "--output", "json"))
    server, token = cli.env["TRAINYARD_SERVER"], cli.env["TRAINYARD_TOKEN"]
    async with AsyncClient(server, token) as client:

        async def running() -> bool:
            return bool((await client.inference_stats(job_id))["queries"]["finished"] >= 3)

        await eventually(running, seconds=60)
        assert (await cli("cancel", job_id)).rc == 0
    followed = await following
    # The job was CANCELLED: exit code 1, as `logs -f` says of it.
    assert followed.rc == 1, followed.stderr
    updates = [json.loads(line) for line in followed.stdout.splitlines()]
    assert updates[-1]["state"] == "CANCELLED" and updates[-1]["total_queries"] is None
    finished = [update["queries"]["finished"] for update in updates]
    assert finished == sorted(finished) and finished[-1] >= 3


BAD_INPUT = [
    (["--generate", "3x0"], "invalid SHAPE '3x0': every dimension is at least 1"),
    (["--generate", "3by4"], "invalid SHAPE '3by4': its dimensions joined by x"),
    (["--generate", "1x2x3x4x5"], "at most 4 dimensions"),
    (["--generate", "4096x4096x4"], "an item holds at most"),
    (["--generate", "4", "--items", "[1]"], "not allowed with argument"),
    ([], "one of the arguments --generate --items is required"),
    (["--items", "@{tmp}/missing.json"], "cannot read"),
    (["--items", '{"a": 1}'], "--items: --items is a JSON array of items"),
    (["--items", "[1,"], "--items: not JSON (line 1 column 4"),
    (["--items", "[]"], "the array of items is empty"),
    (["--items", "[1]", "--seed", "2"], "--seed goes with --generate"),
    (["--generate", "4", "--seed", "-1"], "invalid seed '-1'"),
    (["--generate", "4", "--label", "nokey"], "--label must be KEY=VALUE"),
]


@pytest.mark.parametrize(
    ("extra", "message"), BAD_INPUT, ids=[" ".join(extra) or "no items" for extra, _ in BAD_INPUT]
)
def test_bad_input_is_a_usage_error_before_anything_is_sent(
    extra: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No server: anything sent would be exit code 3.
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    monkeypatch.setenv("TRAINYARD_TOKEN", "t")
    words = [word.replace("{tmp}", str(tmp_path)) for word in extra]
    try:
        code = main(["infer", "x", "--model", "m", "--server", "http://127.0.0.1:9", *words])
    except SystemExit as exited:  # argparse's own errors
        code = exited.code
    captured = capsys.readouterr()
    assert code == 2 and message in captured.err, captured.err
    assert captured.out == ""


@pytest.mark.parametrize("bad", [["--after", "-1"], ["--limit", "0"], ["--limit", "1001"]])
def test_a_bad_page_is_a_usage_error(
    bad: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    monkeypatch.setenv("TRAINYARD_TOKEN", "t")
    assert main(["queries", JOB, "--server", "http://127.0.0.1:9", *bad]) == 2


@pytest.mark.processes
async def test_refused_input_submits_nothing(cluster: Cli) -> None:
    cli = cluster
    good = ["infer", "x", "--model", "sums"]
    cases = [
        (["--generate", "3x0"], 2, "invalid SHAPE"),
        (["--generate", "4", "--items", "[1]"], 2, "not allowed with argument"),
        # The server's refusal of a field is a usage error too.
        (["--generate", "4", "--weight", "0"], 2, "weight"),
        # A model that does not exist is not found, as a job that does not is.
        (["--generate", "4", "--model", "nope"], 4, "no model"),
    ]
    for extra, rc, message in cases:
        refused = await cli(*good, *extra)
        assert refused.rc == rc and message in refused.stderr, (extra, refused.stderr)
        assert refused.stdout == "", extra
    assert (await cli("list", "--output", "json")).json() == []


async def test_the_sdk_submits_follows_and_reads_an_inference_job(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (cluster, _):
        await publish(cluster, tokens.acme, "sums", SUMS, "sums:predict")
        server = str(cluster.make_url(""))
        async with (
            AsyncClient(server, tokens.acme) as acme,
            AsyncClient(server, tokens.admin) as admin,
        ):
            source = {"generate": {"shape": [4], "seed": 1}}
            job = await admin.infer(
                "once",
                "sums",
                input=source,
                batch_size=2,
                queries=3,
                tenant="acme",
                idempotency_key="k1",
                labels={"team": "a"},
            )
            again = await admin.infer(
                "once",
                "sums",
                input=source,
                batch_size=2,
                queries=3,
                tenant="acme",
                idempotency_key="k1",
                labels={"team": "a"},
            )
            assert again["id"] == job["id"] and job["tenant"] == "acme"
            seen = []
            async with aclosing(acme.follow_inference_stats(job["id"])) as updates:
                async for figures in updates:
                    seen.append(figures)
            assert seen[-1]["state"] == "COMPLETED"
            assert seen[-1]["queries"]["finished"] == 3
            assert all(f["state"] != "COMPLETED" for f in seen[:-1])
            assert (await acme.inference_stats(job["id"]))["queries"]["succeeded"] == 3
            page = await acme.inference_queries(job["id"], after=0, limit=1)
            assert [q["index"] for q in page["queries"]] == [1]
            # The blocking client, in a thread: this one's loop runs the server.
            with Client(server, tokens.acme) as blocking:
                updates = await asyncio.to_thread(
                    lambda: list(blocking.follow_inference_stats(job["id"]))
                )
                assert [u["state"] for u in updates] == ["COMPLETED"]
                page = await asyncio.to_thread(blocking.inference_queries, job["id"])
                assert len(page["queries"]) == 3
                figures = await asyncio.to_thread(blocking.inference_stats, job["id"])
                assert figures["total_queries"] == 3
                # Not given, so not sent: the server's.
                assert figures["weight"] == InferenceRequest.model_fields["weight"].default


async def test_job_ids_are_checked_before_anything_is_sent() -> None:
    # No server: a request would be ServerUnreachable.
    async with AsyncClient("http://127.0.0.1:9", "t") as client:
        with pytest.raises(UsageError, match="a job id is a UUID"):
            await client.inference_stats("../nodes")
        with pytest.raises(UsageError, match="a job id is a UUID"):
            await client.inference_queries("42")
        with pytest.raises(UsageError, match="a job id is a UUID"):
            await anext(client.follow_inference_stats("x"))


def test_the_sdk_and_the_command_leave_unset_settings_to_the_server() -> None:
    sdk = inspect.signature(AsyncClient.infer).parameters
    settings = ("batch_size", "queries", "weight", "replicas", "resources", "query_timeout_s")
    assert {name: sdk[name].default for name in settings} == dict.fromkeys(settings)
    args = parser().parse_args(["infer", "x", "--model", "m", "--generate", "4"])
    flags = ["batch_size", "queries", "weight", "replicas", "query_timeout"]
    flags += ["gpus", "cpus", "memory_mb", "image"]
    assert {name: getattr(args, name) for name in flags} == dict.fromkeys(flags)


def _figures(**extra: Any) -> dict[str, Any]:
    counts = dict.fromkeys(("finished", "succeeded", "failed", "running", "queued", "retried"), 0)
    return {
        "job_id": JOB,
        "state": "PROCESSING",
        "model": "acme/sums:1",
        "weight": 2.0,
        "batch_size": 16,
        "total_queries": None,
        "window_s": 10.0,
        "queries": counts,
        "rate": {"window_qps": 0.0, "overall_qps": 0.0},
        "latency_ms": None,
        "replicas": [],
        **extra,
    }


def test_the_table_of_an_endless_job_without_results() -> None:
    text = stats_text(_figures())
    assert "0 (until cancelled) finished" in text and "weight 2" in text
    assert "latency  - (no query has finished)" in text and "REPLICA" not in text
    assert "query rate" not in text
    rate = {"mean": 50.0, "std": 1.0, "median": 50.0, "p90": 60.0, "p95": 61.0, "p99": None}
    shown = stats_text(_figures(query_rate=rate))
    assert "query rate  mean 50.00 q/s, std 1.00 q/s, median 50.00 q/s" in shown
    assert shown.endswith("p99 -")


def test_a_query_s_result_is_one_short_line() -> None:
    query = {"outputs": None, "error": None}
    assert _result(query) is None
    long = _result({**query, "outputs": [{"sum": n} for n in range(100)]})
    assert long is not None and len(long) == RESULT_CHARS and long.endswith("…")
    trace = "Traceback (most recent call last):\n  File x\nZeroDivisionError: division by zero\n"
    assert _result({**query, "error": trace}) == "ZeroDivisionError: division by zero"
    assert _result({**query, "error": "its outputs are not JSON\nmore"}) == (
        "its outputs are not JSON"
    )


async def test_a_stats_stream_that_breaks_off_is_reopened_until_the_job_ends() -> None:
    """A control plane shutting down ends its streams early: the SDK reopens the stream and
    stops only at the figures of the job ended."""
    opened = 0

    async def events(request: web.Request) -> web.StreamResponse:
        nonlocal opened
        opened += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        state = "PROCESSING" if opened == 1 else "COMPLETED"
        await response.write(f"event: stats\ndata: {json.dumps(_figures(state=state))}".encode())
        await response.write(b"\n\n: heartbeat\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.add_routes([web.get(f"/v1/jobs/{JOB}/stats/events", events)])
    async with TestServer(app) as server, AsyncClient(str(server.make_url("")), "t") as client:
        states = [f["state"] async for f in client.follow_inference_stats(JOB)]
    assert (states, opened) == (["PROCESSING", "COMPLETED"], 2)


async def test_the_request_infer_sends() -> None:
    sent: list[tuple[dict[str, Any], str | None, str]] = []

    async def submit(request: web.Request) -> web.Response:
        key = request.headers.get("Idempotency-Key")
        sent.append((await request.json(), key, request.query_string))
        return web.json_response({"id": JOB, "state": "QUEUED"}, status=201)

    app = web.Application()
    app.add_routes([web.post("/v1/inference", submit)])
    async with TestServer(app) as server, AsyncClient(str(server.make_url("")), "t") as client:
        await client.infer("a", "m", input={"items": [1]})
        await client.infer(
            "b",
            "m",
            input={"generate": {"shape": [2]}},
            queries=3,
            resources={"gpus": 1},
            query_timeout_s=5,
            labels={"k": "v"},
            tenant="acme",
            idempotency_key="key",
        )
    # What is not given is not sent: the server decides it.
    assert sent == [
        ({"name": "a", "model": "m", "input": {"items": [1]}}, None, ""),
        (
            {
                "name": "b",
                "model": "m",
                "input": {"generate": {"shape": [2]}},
                "queries": 3,
                "resources": {"gpus": 1},
                "query_timeout_s": 5,
                "labels": {"k": "v"},
            },
            "key",
            "tenant=acme",
        ),
    ]
