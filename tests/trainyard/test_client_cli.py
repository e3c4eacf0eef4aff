"""The user commands of the CLI as a user runs them: `trainyard` subprocesses against a served
control plane (a real process) with a real agent."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from controlplane.jobs.lifecycle import JobStatus
from controlplane.tenants.service import issue_token, set_limits
from harness.served import ServedControlPlane, free_port
from tests.cluster import Plane, RunningAgent
from tests.polling import eventually
from trainyard import api
from trainyard.api import ApiClient
from trainyard.client import AsyncClient
from trainyard.commands import follow_job
from trainyard.render import PlainView

PRINT = [sys.executable, "-c", "print('hello from the learner')"]
METRIC = [
    sys.executable,
    "-c",
    "from runners import metrics; metrics.log(step=7, loss=0.5); print('mine', flush=True)",
]
RANKS = [sys.executable, "-c", "import os; print('hello from rank', os.environ['RANK'])"]
FAIL = [sys.executable, "-c", "import sys; sys.exit(3)"]
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@dataclass
class Cli:
    env: dict[str, str]
    tmp_path: Path

    async def __call__(self, *args: str, **env: str) -> Result:
        # Asynchronously: the agent runs in this test's event loop and must keep working.
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "cli", *args),
            env={**self.env, **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode is not None
        return Result(process.returncode, out.decode(), err.decode())

    def manifest(self, name: str, command: list[str], **extra: Any) -> str:
        path = self.tmp_path / f"{name}.json"
        body = {"name": name, "image": "img", "command": command, "gpus_per_learner": 1}
        path.write_text(json.dumps({**body, "labels": {"suite": "cli"}, **extra}))
        return str(path)


def _base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    return {**env, "TRAINYARD_HOME": str(home)}


@pytest.fixture
async def cli(db_url: str, plane: Plane, agent: RunningAgent, tmp_path: Path) -> AsyncIterator[Cli]:
    served = ServedControlPlane(db_url, tmp_path / "server")
    await served.start()
    token = await issue_token(plane.store, plane.runner, "acme", actor="test")
    env = {
        **_base_env(tmp_path / "client"),
        "TRAINYARD_SERVER": served.url,
        "TRAINYARD_TOKEN": token.plaintext,
    }
    yield Cli(env, tmp_path)
    await served.stop()


async def test_logs_show_what_the_user_printed_and_the_launcher_s_reports_readably(
    cli: Cli,
) -> None:
    done = await cli("submit", cli.manifest("metric", METRIC), "--follow")
    assert done.rc == 0, done.stderr
    job_id = done.stdout.splitlines()[0]
    assert "[attempt 1 learner 0 stdout] mine" in done.stdout
    assert "[attempt 1 learner 0 report] step 7: loss 0.5" in done.stdout
    assert "[attempt 1 learner 0 report] PROCESSING started" in done.stdout
    assert "@@trainyard/1" not in done.stdout

    for follow in ([], ["-f"]):
        shown = (await cli("logs", job_id, *follow)).stdout
        assert "[attempt 1 learner 0 report] step 7: loss 0.5" in shown, follow
        assert "@@trainyard/1" not in shown and "mine" in shown
        raw = (await cli("logs", job_id, "--raw", *follow)).stdout
        assert '@@trainyard/1 {"' in raw and "report]" not in raw and "mine" in raw
        printed = await cli("logs", job_id, "--output", "json", *follow)
        assert [json.loads(line)["line"] for line in printed.stdout.splitlines()] == ["mine"]
        every = await cli("logs", job_id, "--output", "json", "--raw", *follow)
        assert len(every.stdout.splitlines()) > 1


async def test_a_job_of_two_learners_shows_its_ranks_and_names_them_in_its_logs(
    cli: Cli,
) -> None:
    done = await cli("submit", cli.manifest("pair", RANKS, learners=2), "--follow")
    assert done.rc == 0, done.stderr
    job_id = done.stdout.splitlines()[0]
    assert "[attempt 1 rank 0 stdout] hello from rank 0" in done.stdout
    assert "[attempt 1 rank 1 stdout] hello from rank 1" in done.stdout

    job = (await cli("status", job_id, "--output", "json")).json()["job"]
    ranks = job["ranks"]
    assert [(r["rank"], r["node"], r["state"], r["exit_code"]) for r in ranks] == [
        (0, "n1", "COMPLETED", 0),
        (1, "n1", "COMPLETED", 0),
    ]
    # Each rank its own GPU of the job's two.
    assert [gpu for r in ranks for gpu in r["gpus"]] == job["gpus"]
    assert all(len(r["gpus"]) == 1 for r in ranks)

    text = (await cli("status", job_id)).stdout
    table = text.split("ranks:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert table[0].split() == ["RANK", "NODE", "GPUS", "STATE", "EXIT"]
    assert [row.split() for row in table[1:]] == [
        [str(r["rank"]), "n1", r["gpus"][0], "COMPLETED", "0"] for r in ranks
    ]

    for follow in ([], ["-f"]):
        shown = (await cli("logs", job_id, *follow)).stdout
        assert "[attempt 1 rank 1 stdout] hello from rank 1" in shown, follow
        assert "learner 1" not in shown, follow
        raw = (await cli("logs", job_id, "--raw", *follow)).stdout
        assert "[attempt 1 learner 1 stdout] hello from rank 1" in raw, follow
    only = (await cli("logs", job_id, "--learner", "1")).stdout
    assert "hello from rank 1" in only and "hello from rank 0" not in only


async def test_user_commands_against_a_served_control_plane(cli: Cli, tmp_path: Path) -> None:
    done = await cli("submit", cli.manifest("ok", PRINT), "--follow")
    assert done.rc == 0, done.stderr
    ok_id = done.stdout.splitlines()[0]
    assert "[status] COMPLETED, attempt 1, restarts 0" in done.stdout
    assert "hello from the learner" in done.stdout

    failed = await cli("submit", cli.manifest("bad", FAIL, max_restarts=0), "--follow")
    assert failed.rc == 1, failed.stderr
    assert "[status] FAILED" in failed.stdout

    listed = await cli("list", "--label", "suite=cli", "--output", "json")
    assert listed.rc == 0
    assert {job["manifest"]["name"]: job["state"] for job in listed.json()} == {
        "ok": "COMPLETED",
        "bad": "FAILED",
    }
    only = await cli("list", "--state", "COMPLETED", "--output", "json")
    assert [job["id"] for job in only.json()] == [ok_id]

    status = (await cli("status", ok_id, "--output", "json")).json()
    assert status["job"]["state"] == "COMPLETED"
    assert status["job"]["attempt"] == 1
    events = [entry["event"] for entry in status["history"]]
    assert events[0] == "JobSubmitted"
    assert events[-1] == "JobCompleted"
    shown = (await cli("status", ok_id)).stdout
    assert "history:" in shown and "ranks:" not in shown  # one learner: no ranks to tell apart

    logs = await cli("logs", ok_id, "--output", "json")
    hello = {"attempt": 1, "learner": 0, "stream": "stdout", "line": "hello from the learner"}
    assert hello in [json.loads(line) for line in logs.stdout.splitlines()]
    followed = await cli("logs", ok_id, "-f", "--output", "json")
    assert followed.rc == 0
    streamed = [json.loads(line) for line in followed.stdout.splitlines()]
    assert hello in [{key: line[key] for key in hello} for line in streamed]
    assert (await cli("logs", ok_id, "-f", "--learner", "0")).rc == 0

    nodes = (await cli("nodes", "--output", "json")).json()
    assert [node["name"] for node in nodes] == ["n1"]

    # A job no node could hold: its status says so, and that it will not run as it is.
    huge = (await cli("submit", cli.manifest("huge", PRINT, gpus_per_learner=64))).stdout.strip()

    async def told() -> bool:
        pending = (await cli("status", huge, "--output", "json")).json()["pending"]
        return [r["reason"] for r in pending["reasons"]] == ["unschedulable"]

    await eventually(told)
    shown = (await cli("status", huge)).stdout
    assert "queue position" in shown
    assert "pending:" in shown and "unschedulable" in shown and "never" in shown
    assert (await cli("cancel", huge)).rc == 0

    # Cancelling a running job, then cancelling it again (refused: it has finished).
    sleeper = (await cli("submit", cli.manifest("sleeper", SLEEP))).stdout.strip()
    cancelled = await cli("cancel", sleeper)
    assert (cancelled.rc, cancelled.stdout.split()) == (0, [sleeper, "CANCELLED"])
    again = await cli("cancel", sleeper)
    assert again.rc == 1
    assert len(again.stderr.splitlines()) == 1
    assert (await cli("logs", sleeper, "-f")).rc == 1

    missing = await cli("status", str(uuid.uuid4()))
    assert missing.rc == 4
    assert missing.stderr.startswith("trainyard: no job ")
    assert len(missing.stderr.splitlines()) == 1
    assert (await cli("cancel", "not-a-job")).rc == 4

    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"name": "", "image": "img"}))
    rejected = await cli("submit", str(invalid))
    assert rejected.rc == 2
    assert "command:" in rejected.stderr
    assert "name:" in rejected.stderr


async def test_login_saves_a_private_config_that_the_commands_use(cli: Cli, tmp_path: Path) -> None:
    home = tmp_path / "login-home"
    env = _base_env(home)
    nope, token_file = tmp_path / "nope", tmp_path / "token"
    nope.write_text("nope\n")
    wrong = await Cli(env, tmp_path)(
        "login", "--server", cli.env["TRAINYARD_SERVER"], "--token-file", str(nope)
    )
    assert wrong.rc == 1
    assert not (home / "client.json").exists()

    server, token = cli.env["TRAINYARD_SERVER"], cli.env["TRAINYARD_TOKEN"]
    token_file.write_text(token)
    login = await Cli(env, tmp_path)("login", "--server", server, "--token-file", str(token_file))
    assert login.rc == 0, login.stderr
    config = home / "client.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert json.loads(config.read_text()) == {"server": server, "token": token}

    listed = await Cli(env, tmp_path)("list", "--output", "json")
    assert (listed.rc, listed.json()) == (0, [])
    # A flag wins over the config file.
    elsewhere = await Cli(env, tmp_path)("list", "--server", f"http://127.0.0.1:{free_port()}")
    assert elsewhere.rc == 3


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env={**_base_env(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.processes
def test_an_unreachable_server_is_exit_code_3_and_one_line(tmp_path: Path) -> None:
    server = f"http://127.0.0.1:{free_port()}"
    result = _run(tmp_path, "list", TRAINYARD_SERVER=server, TRAINYARD_TOKEN="t")
    assert result.returncode == 3
    assert result.stderr.startswith(f"trainyard: cannot reach the server at {server}")
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.processes
def test_a_manifest_that_is_not_json_is_a_usage_error_naming_the_line(tmp_path: Path) -> None:
    manifest = tmp_path / "job.json"
    manifest.write_text('{\n  "name": "x",\n  "image": "img"\n  "command": ["train"]\n}\n')
    result = _run(
        tmp_path, "submit", str(manifest), TRAINYARD_SERVER="http://x", TRAINYARD_TOKEN="t"
    )
    assert result.returncode == 2
    assert result.stderr == f"trainyard: {manifest}: line 4 column 3: Expecting ',' delimiter\n"


@pytest.mark.processes
def test_missing_server_and_usage_errors_are_exit_code_2(tmp_path: Path) -> None:
    assert _run(tmp_path, "list").returncode == 2
    assert _run(tmp_path, "list", "--state", "NOPE").returncode == 2
    yaml = tmp_path / "job.yaml"
    yaml.write_text("name: x\nimage: img\ncommand: [train]\n")
    result = _run(tmp_path, "submit", str(yaml), TRAINYARD_SERVER="http://x", TRAINYARD_TOKEN="t")
    # Parsed and valid, then sent to a server that does not exist.
    assert result.returncode == 3


async def test_a_dropped_stream_resumes_after_the_last_event_id() -> None:
    seen: list[str | None] = []

    async def events(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Last-Event-ID"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        after = int(request.headers.get("Last-Event-ID", "0"))
        await response.write(f": heartbeat\n\nid: {after + 1}\ndata: {after + 1}\n\n".encode())
        if after == 0:
            assert request.transport is not None
            request.transport.close()  # the connection drops mid-stream
        return response

    app = web.Application()
    app.router.add_get("/stream", events)
    async with TestServer(app) as server, ApiClient(str(server.make_url("")), "t") as client:
        received = []
        async with aclosing(client.follow("/stream")) as stream:
            async for message in stream:
                received.append(message.json())
                if len(received) == 2:
                    break
    assert received == [1, 2]
    assert seen == [None, "1"]


async def test_following_gives_up_on_a_server_gone_for_good(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(api, "RECONNECT_FOR_S", 0.3)
    server = f"http://127.0.0.1:{free_port()}"
    async with AsyncClient(server, "t") as client:
        with pytest.raises(api.ServerUnreachable, match=f"cannot reach the server at {server}"):
            await follow_job(client, str(uuid.uuid4()), PlainView(), None, None)


async def test_limits_refuse_cli_submissions_and_checkpoints_with_one_line(
    cli: Cli, plane: Plane
) -> None:
    limits = {"submissions_per_s": 0.01, "submission_burst": 2}
    await set_limits(plane.store, plane.runner, "acme", limits, actor="test")
    huge = await cli("submit", cli.manifest("huge", SLEEP, memory_mb=1 << 23))
    assert huge.rc == 2 and len(huge.stderr.splitlines()) == 1, huge.stderr
    assert "memory_mb" in huge.stderr and "no node could ever run it" in huge.stderr

    submitted = await cli("submit", cli.manifest("sleeper", SLEEP))
    assert submitted.rc == 0, submitted.stderr
    sleeper = submitted.stdout.strip()
    flood = await cli("submit", cli.manifest("one-too-many", SLEEP))
    assert (flood.rc, flood.stdout) == (1, "")
    assert "submits at most 0.01 jobs per second" in flood.stderr
    assert len(flood.stderr.splitlines()) == 1

    await plane.state(uuid.UUID(sleeper), JobStatus.PROCESSING)
    assert (await cli("checkpoint", sleeper)).rc == 0
    pending = await cli("checkpoint", sleeper)
    assert pending.rc == 1 and "is still pending" in pending.stderr
    assert (await cli("cancel", sleeper)).rc == 0
