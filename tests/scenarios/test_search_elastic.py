"""A search on elastic agents, with real agents on a real Postgres: an agent joins while the
search runs and takes trials; the first one leaves (its learners stopped, their jobs re-queued)
and its trials finish on the other; the search completes with every trial run to its end once
and none created twice.

Which agent claims a trial is a race between equals, so the joining agent is made to win one:
the first agent has room for two trials, the search runs three at once, and the trials wait at
a gate until the joined agent runs the third."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

import asyncpg

from tests.cluster import RunningAgent, agent_config
from tests.controlplane.deployments.serving import serving_cluster
from tests.controlplane.searches.test_search_service import ended, spec, submitted, trials_of
from tests.polling import eventually
from tests.tenancy import Tokens

# A trial: a couple of seconds once the gate (the file `gate` in its working directory, the only
# node folder its sandbox has) exists, checkpointing (a SIGTERM makes it save and exit) so that a
# trial moved to another node resumes.
SLOW = """
import json, os, pathlib, signal, sys, time
from runners import metrics
hp = json.loads(os.environ["TRAINYARD_HPARAMS"])
budget = int(os.environ["TRAINYARD_BUDGET"])
mark = pathlib.Path(os.environ["TRAINYARD_CHECKPOINT_DIR"]) / "reached"
step = int(mark.read_text()) if mark.exists() else 0
signal.signal(signal.SIGTERM, lambda *_: (mark.write_text(str(step)), sys.exit(143)))
while not os.path.exists("gate"):
    time.sleep(0.1)
while step < budget:
    time.sleep(0.25)
    step += 1
    metrics.log(step=step, score=-(hp["x"] - 3) ** 2)
mark.write_text(str(step))
"""


async def open_gate(*work_dirs: Path) -> None:
    """Opens the gate for every learner of the agents working in `work_dirs`, those that start
    later too, until cancelled."""
    while True:
        for work_dir in work_dirs:
            for folder in work_dir.glob("*/attempt-*/learner-*"):
                (folder / "gate").touch(mode=0o644)
        await asyncio.sleep(0.1)


async def test_agents_join_and_leave_during_a_search_and_no_trial_is_lost_or_doubled(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    trial = {
        **spec()["trial"],
        "command": [sys.executable, "-c", SLOW],
        "max_restarts": 3,
    }
    document = spec(
        trial=trial, max_trials=6, max_concurrent_trials=3, budget={"unit": "steps", "max": 8}
    )
    two_trials = dataclasses.replace(agent_config(tmp_path, "n1"), cpus=2)  # a trial: 1 CPU
    async with serving_cluster(db_url, tmp_path, configs=[two_trials]) as (client, [first]):
        search_id = await submitted(client, tokens.acme, document)

        async def started() -> bool:
            return len(await trials_of(client, tokens.acme, search_id)) >= 3

        await eventually(started)
        n2 = agent_config(tmp_path, "n2")
        joined = await RunningAgent(db_url, n2, fake_gpus=0).started()
        try:
            conn = await asyncpg.connect(db_url)
            try:

                async def n2_runs_one() -> bool:
                    rows = await conn.fetch(
                        "SELECT 1 FROM allocations WHERE node = 'n2' AND released_at IS NULL"
                    )
                    return bool(rows)

                await eventually(n2_runs_one, seconds=30)
                opened = asyncio.create_task(open_gate(two_trials.work_dir, n2.work_dir))
                await first.finish()  # leaves: its learners stop, their jobs go back to the queue
                search = await ended(client, tokens.acme, search_id, seconds=120)
                opened.cancel()
                assert search["state"] == "completed", search
                trials = await trials_of(client, tokens.acme, search_id)
                assert [t["number"] for t in trials] == list(range(6))
                assert {t["state"] for t in trials} == {"completed"}
                assert len({t["job_id"] for t in trials}) == 6
                created = await conn.fetchval(
                    "SELECT count(*) FROM events WHERE stream_id = $1 AND type = 'TrialCreated'",
                    f"search-{search_id}",
                )
                assert created == 6
                # Every trial's job ran to COMPLETED once; those moved off n1 resumed on n2.
                moved = await conn.fetch(
                    "SELECT stream_id FROM events WHERE type = 'JobRestarted'"
                    " AND stream_id = ANY($1::text[])",
                    [f"job-{t['job_id']}" for t in trials],
                )
                for t in trials:
                    completions = await conn.fetchval(
                        "SELECT count(*) FROM events"
                        " WHERE stream_id = $1 AND type = 'JobCompleted'",
                        f"job-{t['job_id']}",
                    )
                    assert completions == 1
                print(f"{len(moved)} trial job(s) moved to the other node")
            finally:
                await conn.close()
        finally:
            await joined.finish()
