"""An agent that keeps warm sandboxes (`--warm`), on a real Postgres: a claimed job whose only
learner can start in one does, as the uid the sandbox was made as (now the job's in the
database), with what it imported ahead; a job that cannot (its environment changes how an
interpreter starts) starts cold; the pool makes another as one is taken; and the agent's stop
removes them and gives their uids back."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from uuid import UUID

import asyncpg
import pytest

from controlplane.events.metadata import Metadata
from controlplane.jobs.lifecycle import JobStatus
from controlplane.jobs.manifest import JobManifest
from node_agent.warm import FOLDER, READY, RECORD
from tests.cluster import Plane, RunningAgent, agent_config
from tests.node_agent.test_agent import wait_for_line
from tests.polling import eventually

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only an agent that is root sandboxes")

REPORT = (
    "import os, sys\n"
    "print(f'uid {os.getuid()} preloaded {\"colorsys\" in sys.modules}', flush=True)\n"
)


async def submit(plane: Plane, env: dict[str, str] | None = None) -> UUID:
    manifest = JobManifest.model_validate(
        {
            "name": "warm",
            "image": "img",
            "command": [sys.executable, "-c", REPORT],
            "gpus_per_learner": 1,
            "env": env or {},
        }
    )
    job, _ = await plane.jobs.submit("acme", manifest, Metadata(actor="test", tenant="acme"))
    return job.job_id


def ready_sandboxes(work_dir: Path) -> list[Path]:
    """The warm sandboxes ready and not taken (no learner recorded in them)."""
    folder = work_dir / FOLDER
    if not folder.is_dir():
        return []
    return [
        path
        for path in folder.iterdir()
        if (path / READY).exists() and not (path / RECORD).exists()
    ]


async def test_a_job_starts_in_a_warm_sandbox_as_the_uid_it_was_made_as(
    plane: Plane, tmp_path: Path, owner: asyncpg.Connection
) -> None:
    config = replace(agent_config(tmp_path), warm=1, warm_imports=("colorsys",))
    agent = await RunningAgent(plane.url, config, 1).started()
    try:

        async def made() -> bool:
            return len(ready_sandboxes(config.work_dir)) == 1

        await eventually(made, seconds=60)
        [before] = ready_sandboxes(config.work_dir)
        warm_uids = await owner.fetch("SELECT uid FROM warm_uids WHERE node = 'n1'")
        assert len(warm_uids) == 1

        job_id = await submit(plane)
        await plane.state(job_id, JobStatus.COMPLETED)
        await wait_for_line(plane, job_id, "preloaded")
        uid = await owner.fetchval("SELECT uid FROM learner_uids WHERE job_id = $1", job_id)
        # The sandbox made ahead ran it (what it imported was there), as the uid it held, which
        # is the job's now.
        assert uid == warm_uids[0]["uid"]
        assert f"uid {uid} preloaded True" in await plane.log_text(job_id)

        # Another is made for the next claim; the one the job took went with its learner.
        async def remade() -> bool:
            ready = ready_sandboxes(config.work_dir)
            return len(ready) == 1 and ready != [before]

        await eventually(remade, seconds=60)

        # A job whose environment changes how an interpreter starts runs cold.
        cold = await submit(plane, env={"OMP_NUM_THREADS": "1"})
        await plane.state(cold, JobStatus.COMPLETED)
        await wait_for_line(plane, cold, "preloaded")
        assert any("preloaded False" in line for line in await plane.log_text(cold))
    finally:
        await agent.finish()
    # Its stop removed the sandboxes no job took and gave their uids back.
    assert list((config.work_dir / FOLDER).iterdir()) == []
    assert await owner.fetchval("SELECT count(*) FROM warm_uids WHERE node = 'n1'") == 0
