"""Learner uids across the fleet: two jobs a tenant engineered to share a uid (their ids collide
under the old per-node hash) get two, on two nodes sharing a checkpoint volume, and cannot
read or change each other's files; uids are allocated once across concurrent nodes; a job's
folders go, and then its uid, once its retention ends; a node out of uids leaves jobs queued."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import pytest

from controlplane.database import AGENT_ROLE, create_pool
from controlplane.events.metadata import Metadata
from controlplane.jobs.lifecycle import JobStatus
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.service import idempotent_id
from controlplane.queries import Q
from controlplane.tenants.service import create_tenant
from node_agent.agent import AgentConfig
from node_agent.folders import Disposal, dispose, expired_folders
from node_agent.learners import job_dir
from node_agent.users import UidRange
from runners.config import CHECKPOINT_DIR
from tests.cluster import Plane, RunningAgent, agent_config, learner_space
from tests.managers import lifecycle_manager
from tests.node_agent.test_agent import wait_for_line
from tests.polling import eventually

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the agent must be root to do this")


def old_uid(job_id: UUID, uids: UidRange) -> int:
    """The uid a node chose for a job before uids were allocated fleet-wide: a hash of the
    job's id, unique only among the node's running jobs."""
    return uids.start + int.from_bytes(hashlib.sha256(job_id.bytes).digest()[:8], "big") % (
        uids.count
    )


def colliding_key(victim: UUID, tenant: str, uids: UidRange) -> str:
    """An idempotency key whose job, submitted by `tenant`, the old scheme gave the victim's
    uid: job ids are uuid5 of the key, so a tenant finds one offline in some 65,536 tries."""
    target = old_uid(victim, uids)
    n = 0
    while old_uid(idempotent_id(tenant, f"key-{n}"), uids) != target:
        n += 1
    return f"key-{n}"


def node(tmp_path: Path, name: str, shared: Path, uids: UidRange) -> AgentConfig:
    return replace(
        agent_config(tmp_path, name), checkpoint_dir=shared, learner_uids=uids, folder_sweep_s=0.2
    )


async def submit(plane: Plane, tenant: str, key: str, code: str) -> UUID:
    manifest = JobManifest.model_validate(
        {
            "name": "t",
            "image": "img",
            "command": [sys.executable, "-c", code],
            "gpus_per_learner": 1,
        }
    )
    metadata = Metadata(actor=f"tenant:{tenant}", tenant=tenant)
    job, _ = await plane.jobs.submit(tenant, manifest, metadata, idempotency_key=key)
    return job.job_id


VICTIM = (
    "import os, time\n"
    f"path = os.path.join(os.environ['{CHECKPOINT_DIR}'], 'weights')\n"
    "open(path, 'w').write('the victim s weights')\n"
    "print(f'saved as {os.getuid()}', flush=True)\n"
    "time.sleep(60)\n"
)


def thief(path: Path) -> str:
    """Code that tries to read, then to overwrite, the file at `path`, and says how it went."""
    return (
        "import os\n"
        f"path = {str(path)!r}\n"
        "print(f'probing as {os.getuid()}', flush=True)\n"
        "for mode, what in (('r', 'read'), ('a', 'overwrote')):\n"
        "    try:\n"
        "        open(path, mode)\n"
        "        print(what, flush=True)\n"
        "    except OSError as exc:\n"
        "        print('refused', type(exc).__name__, flush=True)\n"
        "print('probed', flush=True)\n"
    )


@root_only
async def test_two_jobs_engineered_to_collide_get_two_uids_and_cannot_touch_each_other(
    plane: Plane, tmp_path: Path, owner: asyncpg.Connection
) -> None:
    uids = UidRange(200000, 65536)
    shared = learner_space() / "checkpoints"  # the checkpoint volume both nodes mount
    await create_tenant(plane.store, plane.runner, "globex", actor="test")
    victim_id = idempotent_id("acme", "nightly")
    key = colliding_key(victim_id, "globex", uids)
    thief_id = idempotent_id("globex", key)
    assert old_uid(victim_id, uids) == old_uid(thief_id, uids)  # what the tenant engineered

    first = await RunningAgent(plane.url, node(tmp_path, "n1", shared, uids), 1).started()
    second = None
    try:
        assert await submit(plane, "acme", "nightly", VICTIM) == victim_id
        await wait_for_line(plane, victim_id, "saved as ")
        # n1's GPU is the victim's: the thief's job runs on n2, while the victim runs.
        second = await RunningAgent(plane.url, node(tmp_path, "n2", shared, uids), 1).started()
        weights = shared / str(victim_id) / "checkpoints" / "learner-0" / "weights"
        assert await submit(plane, "globex", key, thief(weights)) == thief_id
        await plane.state(thief_id, JobStatus.COMPLETED)
        await wait_for_line(plane, thief_id, "probed")
        lines = await plane.log_text(thief_id)
        assert "read" not in lines and "overwrote" not in lines
        # Not its user's to open (or, in a sandbox, not even there to see).
        refused = [line for line in lines if line.startswith("refused ")]
        assert set(refused) <= {"refused PermissionError", "refused FileNotFoundError"}
        assert len(refused) == 2
        # Whatever else keeps it out, the two jobs' learners ran as two users.
        [victim_as] = [line for line in await plane.log_text(victim_id) if "saved as" in line]
        [thief_as] = [line for line in lines if line.startswith("probing as ")]
        assert victim_as.rsplit(" ", 1)[1] != thief_as.rsplit(" ", 1)[1]
        assert weights.read_text() == "the victim s weights"
        held = {r["job_id"]: r["uid"] for r in await owner.fetch("SELECT * FROM learner_uids")}
        assert held[victim_id] != held[thief_id]
        assert {held[victim_id], held[thief_id]} <= set(uids.uids)
        assert (shared / str(victim_id)).stat().st_uid == held[victim_id]
        assert (shared / str(thief_id)).stat().st_uid == held[thief_id]
    finally:
        if second is not None:
            await second.finish()
        await first.finish()


async def test_nodes_allocating_at_once_never_hand_out_one_uid_twice(db_url: str) -> None:
    # Two nodes' pools, as agents run, racing for a small range.
    pools = [await create_pool(db_url, min_size=4, max_size=4, role=AGENT_ROLE) for _ in range(2)]
    try:
        jobs = [uuid4() for _ in range(40)]

        async def allocate(n: int) -> int | None:
            uid = await pools[n % 2].fetchval(Q["allocate_learner_uid"], jobs[n // 2], 1000, 30)
            return None if uid is None else int(uid)

        # Each job asked for twice, once by each node: one uid either way.
        got = await asyncio.gather(*(allocate(n) for n in range(80)))
        by_job: dict[UUID, set[int | None]] = {}
        for n, uid in enumerate(got):
            by_job.setdefault(jobs[n // 2], set()).add(uid)
        assert all(len(found) == 1 for found in by_job.values())
        held = [uid for found in by_job.values() for uid in found if uid is not None]
        # 30 uids for 40 jobs: every uid given once, and the other 10 jobs got none.
        assert sorted(held) == list(range(1000, 1030))
        assert sum(None in found for found in by_job.values()) == 10
    finally:
        for pool in pools:
            await pool.close()


@root_only
async def test_a_job_s_folders_go_at_its_retention_s_end_and_then_its_uid_to_a_waiting_job(
    plane: Plane, tmp_path: Path, owner: asyncpg.Connection
) -> None:
    one = UidRange(290000, 1)  # a range of one uid: the second job waits for it
    config = node(tmp_path, "n1", learner_space() / "checkpoints", one)
    manager = lifecycle_manager(plane.url, plane.pool, plane.store, log_retention_s=1.0)
    agent = await RunningAgent(plane.url, config, 2).started()
    try:
        first = await submit(plane, "acme", "first", "print('done', flush=True)")
        await plane.state(first, JobStatus.COMPLETED)
        folder = job_dir(config.work_dir, first)
        assert folder.stat().st_uid == one.start
        second = await submit(plane, "acme", "second", "print('mine', flush=True)")
        # A GPU is free, but no uid: the job stays queued (the agent logs why), not failed.
        await asyncio.sleep(1.5)
        waiting = await plane.jobs.load(second)
        assert waiting is not None and waiting.state is JobStatus.QUEUED

        async def handed_on() -> bool:
            await manager.sweep()  # past the retention: the folders go, then the uid
            taken = "SELECT job_id FROM learner_uids WHERE uid = $1"
            return bool(await owner.fetchval(taken, one.start) == second)

        await eventually(handed_on, seconds=30)
        assert not folder.exists()
        assert not (config.checkpoint_root / str(first)).exists()
        assert (
            await owner.fetchval("SELECT count(*) FROM job_folders WHERE job_id = $1", first) == 0
        )
        # The uid went to the job that waited, and it ran as it.
        await plane.state(second, JobStatus.COMPLETED)
        await wait_for_line(plane, second, "mine")
        assert job_dir(config.work_dir, second).stat().st_uid == one.start
    finally:
        await agent.finish()


async def test_folders_of_an_unended_job_and_their_uid_stay_past_the_retention(
    plane: Plane, owner: asyncpg.Connection
) -> None:
    job_id = await submit(plane, "acme", "running", "pass")
    await plane.state(job_id, JobStatus.QUEUED)
    uid = await owner.fetchval(Q["allocate_learner_uid"], job_id, 300000, 10)
    await owner.execute(Q["record_job_folders"], job_id, "n1", uid, job_id)
    await owner.execute(
        "UPDATE job_folders SET made_at = now() - interval '1 day';"
        "UPDATE learner_uids SET allocated_at = now() - interval '1 day'"
    )
    manager = lifecycle_manager(plane.url, plane.pool, plane.store, log_retention_s=1.0)
    await manager.sweep()
    assert await owner.fetch(Q["expired_job_folders"], "n1") == []
    assert await owner.fetchval("SELECT uid FROM learner_uids WHERE job_id = $1", job_id) == uid


def test_what_an_expired_job_s_folders_become(tmp_path: Path) -> None:
    me = os.geteuid()
    job, trial = uuid4(), uuid4()
    work, checkpoints = tmp_path / "work", tmp_path / "checkpoints"
    # Its own folder, and the checkpoint folder of its trial, which a later rung may still use.
    assert expired_folders(work, checkpoints, job, trial, True) == {
        (work, str(job)): False,
        (checkpoints, str(trial)): True,
    }
    # Checkpoints under the work folder, the job's own: one folder, kept while used.
    assert expired_folders(work, work, job, job, True) == {(work, str(job)): True}
    for folder in (work / str(job), checkpoints / str(trial)):
        folder.mkdir(parents=True)
        (folder / "file").write_text("x")
    (work / "elsewhere").mkdir()
    (work / "planted").symlink_to(work / "elsewhere")
    # The agent's own learners (no uid): a used folder stays, an unused one goes.
    assert dispose(checkpoints, str(trial), None, True) is Disposal.LEAVE
    assert dispose(work, str(job), None, False) is Disposal.REMOVE
    assert not (work / str(job)).exists()
    # A symlink is never followed, nor removed; gone already is nothing to do.
    assert dispose(work, "planted", None, False) is Disposal.LEAVE
    assert (work / "elsewhere").is_dir()
    assert dispose(work, str(uuid4()), None, False) is Disposal.LEAVE
    # Another user's folder (a later rung took it over) is left to that user's job.
    assert dispose(checkpoints, str(trial), me + 1, False) is Disposal.LEAVE


@root_only
def test_a_used_checkpoint_folder_of_the_job_s_uid_is_handed_back_to_the_agent(
    tmp_path: Path,
) -> None:
    uid = 270000
    folder = tmp_path / "trial"
    (folder / "checkpoints").mkdir(parents=True)
    os.chown(folder, uid, uid)
    os.chown(folder / "checkpoints", uid, uid)
    assert dispose(tmp_path, "trial", uid, True) is Disposal.HAND_BACK
    info = folder.stat()
    # Nobody but the agent passes through it now: the uid may go to another job.
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), 0o700)
    assert (folder / "checkpoints").is_dir()
