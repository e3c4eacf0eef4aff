"""`trainyard simulate` as operators run it: against a past recorded in Postgres, JSON or a
table, the same bytes each time, nothing written; and bad input refused with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.events.store import EventStore
from tests.sim.past import Past, fair_share_past

pytestmark = pytest.mark.processes


def simulate(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"TRAINYARD_DATABASE_URL": url} if url else {})}
    return subprocess.run(
        [sys.executable, "-m", "cli", "simulate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


async def test_a_replay_reports_as_json_or_a_table_the_same_each_time_and_writes_nothing(
    db_url: str, store: EventStore
) -> None:
    await fair_share_past(Past(store))
    tail = await store.log_tail()
    first = simulate("--json", url=db_url)
    assert first.returncode == 0, first.stderr
    found = json.loads(first.stdout)
    assert found["policy"]["name"] == "current"
    assert found["simulated"]["jobs"] == found["recorded"]["jobs"] == 6
    assert found["difference"]["start_order_agreement"] == 1.0
    assert found["difference"]["start_time_error"] == 0.0
    assert simulate("--json", url=db_url).stdout == first.stdout

    fifo = simulate("--policy", "fifo", "--since", "2026-03-01T09:00:03Z", url=db_url)
    assert fifo.returncode == 0, fifo.stderr
    assert "policy fifo: order fifo, quotas on" in fifo.stdout
    assert "start order agreement" in fifo.stdout
    # The window holds a4, b1 and b2 (submitted from 3 s on).
    windowed = json.loads(
        simulate("--json", "--weight", "b=2", "--since", "2026-03-01T09:00:03Z", url=db_url).stdout
    )
    assert windowed["recorded"]["jobs"] == 3
    assert windowed["policy"]["weights"] == {"b": 2.0}
    # Read in a READ ONLY transaction: the log is as it was.
    assert await store.log_tail() == tail


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "lottery"], "trainyard: --policy: no policy named 'lottery'"),
        (["--weight", "a=-1"], "trainyard: --weight a: a weight must be a finite number"),
        (["--policy", "fifo", "--weight", "a=2"], "weights apply to fair share"),
        (["--since", "2026-03-01T09:00:00"], "has no UTC offset"),
        (["--policy", "fifo", "--policy-file", "p.json"], "not allowed with argument"),
    ],
)
def test_bad_arguments_are_exit_2(args: list[str], message: str) -> None:
    result = simulate(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_bad_policy_file_is_exit_2_naming_the_field(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("order: fair_share\nweights:\n  acme: lots\n")
    result = simulate("--policy-file", str(policy))
    assert result.returncode == 2
    assert result.stderr == (
        f"trainyard: {policy}: weights.acme: Input should be a valid number, unable to parse "
        "string as a number\n"
    )
