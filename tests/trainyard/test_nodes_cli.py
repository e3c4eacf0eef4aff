"""`trainyard nodes drain | undrain` as the operator runs them: `trainyard` subprocesses against a
served control plane (a real process) on a real Postgres, with a real agent logged in as agents
are (its login may not undrain its own node). End to end: the drained node's job goes back to
the queue, preempted, spending no restart, and runs there again once the node is undrained."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from controlplane.jobs.lifecycle import JobStatus
from controlplane.tenants.service import issue_token
from harness.served import ServedControlPlane
from node_agent.attempt import drained
from tests.cluster import Plane, RunningAgent
from tests.node_agent.test_agent import SLEEPER, wait_for_line


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Cli:
    env: dict[str, str]

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


@pytest.fixture
async def cli(db_url: str, tmp_path: Path) -> AsyncIterator[Cli]:
    """The operator's `trainyard`: TRAINYARD_HOME is the control plane's, whose admin token
    `nodes drain` finds there."""
    served = ServedControlPlane(db_url, tmp_path / "server")
    await served.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    yield Cli({**env, "TRAINYARD_HOME": str(served.home), "TRAINYARD_SERVER": served.url})
    await served.stop()


async def test_a_drained_node_s_job_is_preempted_and_runs_again_once_undrained(
    cli: Cli, plane: Plane, agent: RunningAgent, owner: asyncpg.Connection
) -> None:
    # No restart allowed at all: a drain that spent one would fail the job.
    job_id = await plane.submit(SLEEPER, max_restarts=0)
    await plane.state(job_id, JobStatus.PROCESSING)
    await wait_for_line(plane, job_id, "ready")

    done = await cli("nodes", "drain", "n1", "--reason", "kernel upgrade")
    assert done.rc == 0, done.stderr
    assert done.stdout.startswith("node n1 is draining")
    job = await plane.state(job_id, JobStatus.QUEUED)
    assert (job.attempt, job.restarts) == (2, 0)
    assert job.transitions[-1].reason == drained("n1")
    await wait_for_line(plane, job_id, "terminating")  # SIGTERM: its grace to checkpoint
    preempted = await owner.fetchval(
        "SELECT (data ->> 'preempted')::boolean FROM events"
        " WHERE stream_id = $1 AND type = 'JobRestarted'",
        f"job-{job_id}",
    )
    assert preempted is True
    reason = await owner.fetchval(
        "SELECT data ->> 'reason' FROM events WHERE stream_id = 'node-n1' AND type = 'NodeDrained'"
    )
    assert reason == "kernel upgrade"

    admin = (Path(cli.env["TRAINYARD_HOME"]) / "admin-token").read_text().strip()
    listed = await cli("nodes", "--output", "json", TRAINYARD_TOKEN=admin)
    assert [(n["name"], n["draining"]) for n in json.loads(listed.stdout)] == [("n1", True)]
    table = (await cli("nodes", TRAINYARD_TOKEN=admin)).stdout.splitlines()
    assert table[1].split()[:2] == ["n1", "DRAINING"]
    again = await cli("nodes", "drain", "n1")  # idempotent
    assert again.rc == 0, again.stderr

    # Draining, the agent runs on and claims nothing: the job waits.
    await asyncio.sleep(1.5)
    assert not agent.task.done()
    assert (await plane.state(job_id, JobStatus.QUEUED)).attempt == 2

    back = await cli("nodes", "undrain", "n1")
    assert (back.rc, back.stdout) == (0, "node n1 is back in service\n"), back.stderr
    job = await plane.state(job_id, JobStatus.PROCESSING)
    assert (job.attempt, job.restarts, job.nodes) == (2, 0, ["n1"])


async def test_an_unknown_node_exits_4_and_a_tenant_s_token_is_refused(
    cli: Cli, plane: Plane, owner: asyncpg.Connection
) -> None:
    for command in ("drain", "undrain"):
        missing = await cli("nodes", command, "nowhere")
        assert (missing.rc, missing.stdout) == (4, "")
        assert missing.stderr == "trainyard: no node named 'nowhere'\n"
    token = await issue_token(plane.store, plane.runner, "acme", actor="test")
    refused = await cli("nodes", "drain", "nowhere", TRAINYARD_TOKEN=token.plaintext)
    assert (refused.rc, refused.stdout) == (1, "")
    assert refused.stderr == "trainyard: only the admin token may drain and undrain nodes\n"
    assert await owner.fetchval("SELECT count(*) FROM events WHERE stream_id LIKE 'node-%'") == 0
