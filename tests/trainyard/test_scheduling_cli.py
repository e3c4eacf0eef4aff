"""`trainyard scheduling policy | set-policy FILE` as the operator runs them: `trainyard`
subprocesses against a served control plane (a real process) on a real Postgres. A policy file
switches the claim policy once; a bad file is refused naming its line or field (exit code 2)
and a tenant's token by the server (exit code 1), with nothing written either way."""

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

from harness.served import ServedControlPlane
from tests.tenancy import event_count


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Cli:
    env: dict[str, str]

    async def __call__(self, *args: str, **env: str) -> Result:
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
    `scheduling set-policy` finds there."""
    served = ServedControlPlane(db_url, tmp_path / "server")
    await served.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    yield Cli({**env, "TRAINYARD_HOME": str(served.home), "TRAINYARD_SERVER": served.url})
    await served.stop()


async def test_a_policy_file_switches_the_policy_once(
    cli: Cli, tmp_path: Path, owner: asyncpg.Connection
) -> None:
    shown = await cli("scheduling", "policy")
    assert shown.rc == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        "order   fair_share",
        "quotas  hold",
        "set by  nobody: the default holds",
    ]
    fifo = tmp_path / "fifo.yaml"
    fifo.write_text("order: fifo\nquotas: false\n")
    switched = await cli("scheduling", "set-policy", str(fifo), "--reason", "night batch")
    assert switched.rc == 0, switched.stderr
    assert switched.stdout.startswith("order   fifo\nquotas  off")
    assert "claims follow fifo, quotas off from the next claim on" in switched.stderr
    events = await event_count(owner)
    again = await cli("scheduling", "set-policy", str(fifo), "--output", "json")
    assert again.rc == 0, again.stderr
    assert json.loads(again.stdout)["changed"] is False
    assert "nothing changed" in again.stderr
    assert await event_count(owner) == events
    shown = json.loads((await cli("scheduling", "policy", "--output", "json")).stdout)
    assert (shown["order"], shown["quotas"], shown["set_by"], shown["reason"]) == (
        "fifo",
        False,
        "admin",
        "night batch",
    )


async def test_a_bad_file_or_a_tenant_s_token_changes_nothing(
    cli: Cli, tmp_path: Path, owner: asyncpg.Connection
) -> None:
    before = await event_count(owner)
    cases = {
        "lottery.yaml": ("order: lottery\n", "order: Input should be"),
        "weights.yaml": ("order: fair_share\nweights: {acme: 2}\n", "weights: a tenant's weight"),
        "broken.json": ('{"order": "fifo"', "broken.json:1:17:"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        refused = await cli("scheduling", "set-policy", str(path))
        assert refused.rc == 2, (name, refused.stderr)
        assert refused.stderr.startswith(f"trainyard: {path}") and message in refused.stderr
    missing = await cli("scheduling", "set-policy", str(tmp_path / "none.yaml"))
    assert missing.rc == 2 and "cannot read it" in missing.stderr
    fifo = tmp_path / "fifo.yaml"
    fifo.write_text("order: fifo\n")
    created = await cli("tenants", "create", "acme")
    assert created.rc == 0, created.stderr
    token = created.stdout.strip()
    tenant = await cli("scheduling", "set-policy", str(fifo), TRAINYARD_TOKEN=token)
    assert tenant.rc == 1 and "only the admin token" in tenant.stderr, tenant.stderr
    # A tenant reads the policy its jobs are claimed under.
    read = await cli("scheduling", "policy", TRAINYARD_TOKEN=token)
    assert read.rc == 0 and read.stdout.startswith("order   fair_share"), read.stderr
    before += 2  # the tenant's creation and its token
    assert await event_count(owner) == before
    assert (
        json.loads((await cli("scheduling", "policy", "--output", "json")).stdout)["set_by"] is None
    )
