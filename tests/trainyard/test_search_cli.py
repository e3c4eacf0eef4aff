"""Searches as a user runs them: `trainyard search ...` subprocesses against the control plane's
app on a real Postgres with a real agent; what the commands refuse before sending anything."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.controlplane.deployments.serving import serving_cluster
from tests.controlplane.searches.test_search_service import spec
from tests.polling import eventually
from tests.tenancy import Tokens
from tests.trainyard.test_client_cli import Cli
from tests.trainyard.test_models_cli import user


@pytest.fixture
async def cli(db_url: str, tmp_path: Path, tokens: Tokens) -> AsyncIterator[Cli]:
    async with serving_cluster(db_url, tmp_path, agents=1) as (client, _):
        yield user(tmp_path, str(client.make_url("")), tokens.acme)


@pytest.mark.processes
async def test_a_search_is_submitted_followed_read_and_exported(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(spec(max_trials=3)))
    submitted = await cli("search", "submit", str(path), "--follow")
    assert submitted.rc == 0, submitted.stderr
    search_id = submitted.stdout.splitlines()[0]
    assert str(uuid.UUID(search_id)) == search_id
    # Not a terminal: a line per event, then the trials' table.
    assert "TrialCreated trial 0" in submitted.stdout
    assert "BestUpdated trial" in submitted.stdout
    assert f"search {search_id} completed" in submitted.stderr

    async def shown_completed() -> bool:
        # The stream said so; the read model `status` reads catches up a moment later.
        status = await cli("search", "status", search_id)
        assert status.rc == 0, status.stderr
        return "completed" in status.stdout and "3 of at most 3" in status.stdout

    await eventually(shown_completed)

    trials = await cli("search", "trials", search_id, "--output", "json")
    rows = json.loads(trials.stdout)
    assert [t["state"] for t in rows] == ["completed"] * 3

    table = await cli("search", "trials", search_id)
    assert table.stdout.splitlines()[0].split() == [
        "TRIAL",
        "STATE",
        "RUNG",
        "BUDGET",
        "METRIC",
        "JOB",
        "HPARAMS",
    ]

    listed = await cli("search", "list", "--output", "json")
    assert [s["id"] for s in json.loads(listed.stdout)] == [search_id]

    exported = await cli("search", "best", search_id, "--manifest")
    manifest = json.loads(exported.stdout)
    best = max(rows, key=lambda t: t["metric"])
    assert manifest["hparams"]["values"] == best["hparams"]
    job_file = tmp_path / "best.json"
    job_file.write_text(exported.stdout)
    again = await cli("submit", str(job_file))
    assert again.rc == 0, again.stderr

    # Cancelling an ended search is refused (409), with one line saying why.
    refused = await cli("search", "cancel", search_id)
    assert refused.rc != 0 and "ended" in refused.stderr


async def test_a_bad_spec_file_is_refused_before_sending(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec(max_trials=0)))
    refused = await cli("search", "submit", str(path))
    assert refused.rc == 2
    assert "invalid search" in refused.stderr and "max_trials" in refused.stderr
    listed = await cli("search", "list", "--output", "json")
    assert json.loads(listed.stdout) == []
    bad_id = await cli("search", "status", "not-a-uuid")
    assert bad_id.rc == 2 and "search id is a UUID" in bad_id.stderr
