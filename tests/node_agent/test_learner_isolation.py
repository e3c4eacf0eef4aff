"""Learners as a hostile tenant would write them, under the process runtime with an agent that
is root (as the tests run): each job runs as a uid of its own, in folders only it can read,
with nothing of the agent's; what it plants in its folders never makes the agent read, write,
chown or adopt anything of someone else's. In its sandbox (node_agent/sandbox.py), the agent's
files and processes and other jobs' folders are not even there; test_sandbox_contract.py probes
the sandbox itself."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sys
from dataclasses import replace
from pathlib import Path
from uuid import uuid4

import pytest

from controlplane.jobs.lifecycle import JobStatus
from controlplane.jobs.locations import RESULTS_ROOTS_ENV
from node_agent.folders import adopt_files, make_folder, prepare
from node_agent.learners import job_dir, learner_dir
from node_agent.process_runtime import ProcessRuntime, find_learners, process_env
from node_agent.runtime import Folder, LearnerSpec, LearnerStartError, Shared
from node_agent.users import UidRange
from tests.cluster import learner_space
from tests.node_agent.test_agent import wait_for_line
from tests.node_agent.twin import Twin, TwinAgent
from tests.polling import eventually

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent must be root to do this")

UIDS = UidRange(200000, 65536)


def users(count: int) -> list[tuple[int, int]]:
    """Distinct users of the range, as the database hands jobs theirs (from a random start:
    the tests running at once on this machine rarely meet)."""
    return [(uid, uid) for uid in random.sample(UIDS.uids, count)]


PROBE = (
    "import os, sys\n"
    "print(f'ids {os.getuid()} {os.getgid()} {os.getgroups()}')\n"
    "for path in sys.argv[1:]:\n"
    "    try:\n"
    "        open(path, 'rb').read()\n"
    "        print(f'read {path}')\n"
    "    except OSError as exc:\n"
    "        print(f'refused {path} {type(exc).__name__}')\n"
    "print('env ' + ' '.join(sorted(os.environ)))\n"
)
"""A learner that says who it runs as, which of the paths it is given it could read, and the
names in its environment."""


async def test_a_learner_runs_as_its_job_s_own_user_and_reads_nothing_of_the_agent_s(
    twin: Twin, twin_agent: TwinAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    token = home / "admin-token"
    token.write_text("the admin token\n")
    token.chmod(0o600)
    # What the agent's environment holds (the database URL with its password, say).
    monkeypatch.setenv("TRAINYARD_DATABASE_URL", "postgresql://agent:secret@db/trainyard")
    agent_environ = f"/proc/{os.getpid()}/environ"
    job_id = await twin.submit([sys.executable, "-c", PROBE, str(token), agent_environ])
    await twin.state(job_id, JobStatus.COMPLETED)
    # Neither is in its sandbox: the agent is not in its pid namespace, its home not mounted.
    await wait_for_line(twin, job_id, f"refused {agent_environ} FileNotFoundError")
    lines = await twin.log_text(job_id)
    assert f"refused {token} FileNotFoundError" in lines
    [ids] = [line.split(" ", 1)[1] for line in lines if line.startswith("ids ")]
    uid, gid, groups = ids.split(" ", 2)
    assert int(uid) in UIDS and gid == uid and groups == "[]"
    [env] = [line.split()[1:] for line in lines if line.startswith("env ")]
    assert "TRAINYARD_DATABASE_URL" not in env
    assert not [name for name in env if "TOKEN" in name]
    # Its folders are its user's alone.
    info = job_dir(twin_agent.config.work_dir, job_id).stat()
    assert (info.st_uid, info.st_mode & 0o777) == (int(uid), 0o700)
    assert twin_agent.config.work_dir.stat().st_mode & 0o777 == 0o711


async def test_two_jobs_run_as_two_users_and_cannot_read_each_other_s_folders(
    twin: Twin, twin_agent: TwinAgent, tmp_path: Path
) -> None:
    sleeper = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"]
    first = await twin.submit(sleeper)
    await wait_for_line(twin, first, "up")
    other = job_dir(twin_agent.config.work_dir, first)
    second = await twin.submit([sys.executable, "-c", PROBE, str(other / "attempt-1")])
    await twin.state(second, JobStatus.COMPLETED)
    # Not in its sandbox, which has its own job's folder alone.
    await wait_for_line(twin, second, f"refused {other / 'attempt-1'} FileNotFoundError")
    owners = {job_dir(twin_agent.config.work_dir, j).stat().st_uid for j in (first, second)}
    assert len(owners) == 2 and all(uid in UIDS for uid in owners)


def test_a_symlink_planted_among_a_job_s_folders_is_refused_not_followed(
    tmp_path: Path,
) -> None:
    base, victim = tmp_path / "work", tmp_path / "etc"
    base.mkdir()
    victim.mkdir(mode=0o755)
    job = base / "job"
    make_folder(base, job, (UIDS.start, UIDS.start))
    # The job's code owns its folder: it replaces the next attempt's folder with a link.
    (job / "attempt-2").symlink_to(victim)
    with pytest.raises(OSError, match=r"'attempt-2' on the way to .* is not a directory"):
        make_folder(base, job / "attempt-2" / "learner-0", (UIDS.start, UIDS.start))
    # Nothing was made, chowned or chmodded through it.
    assert list(victim.iterdir()) == []
    info = victim.stat()
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o755)


def spec_in(work: Path, code: str, user: tuple[int, int] | None) -> LearnerSpec:
    job_id = uuid4()
    workdir = learner_dir(work, job_id, 1, 0)
    return LearnerSpec(
        job_id=job_id,
        attempt=1,
        learner=0,
        epoch=1,
        node=f"n-{job_id.hex[:8]}",
        image="unused",
        command=[sys.executable, "-c", code],
        env={},
        workdir=workdir,
        gpus=[],
        cpus=1,
        memory_mb=4096,
        user=user,
        folders=[Folder(work, workdir)],
    )


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return learner_space()


@pytest.mark.parametrize(
    "plant",
    [
        "os.symlink({secret!r}, 'stdout.log')",  # the agent's secret, read by the agent
        "os.mkfifo('stdout.log')",  # a FIFO no one writes: opening it would block the agent
    ],
)
async def test_an_output_file_the_learner_replaced_is_not_read_for_it(
    work: Path, tmp_path: Path, plant: str
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("the agent's secret\n")
    secret.chmod(0o600)
    code = f"import os\nos.remove('stdout.log')\n{plant.format(secret=str(secret))}\n"
    [user] = users(1)
    runtime = ProcessRuntime(work)
    learner_spec = spec_in(work, code, user)
    started = await runtime.start(learner_spec)
    assert (await started.wait()).code == 0
    # An agent that restarts reads the learner's output again: never the link's target, and
    # without waiting on a FIFO.
    adopted = await runtime.adopt(learner_spec, None)
    assert adopted is not None
    async with asyncio.timeout(10):
        assert [line.text async for line in adopted.lines()] == []


def processes_of(uid: int) -> list[int]:
    """The processes running as `uid` (a job's user: all of them are the job's)."""
    found = []
    for name in os.listdir("/proc"):
        with contextlib.suppress(OSError):  # ended meanwhile
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                found.append(int(name))
    return found


async def test_processes_a_learner_leaves_behind_end_with_it(work: Path) -> None:
    # A daemon the command detaches (its own session): it outlives the learner's group, not
    # its pid namespace, which ends with the learner (and remove() empties its cgroup).
    code = (
        "import os, subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
    )
    [user] = users(1)
    started = await ProcessRuntime(work).start(spec_in(work, code, user))
    assert (await started.wait()).code == 0

    async def gone() -> bool:
        return not processes_of(user[0])

    await eventually(gone)
    await started.remove()


async def test_a_process_posing_as_another_job_s_learner_is_not_adopted(work: Path) -> None:
    sleep = "import time; time.sleep(60)"
    mine, other = users(2)
    victim = replace(spec_in(work, sleep, None), user=mine)
    real = await ProcessRuntime(work).start(victim)
    # Started by another job's code (its own user), in a session of its own, with exactly
    # the victim's variables: a restarted agent must not take it for the victim's learner.
    # sleep(1), not this interpreter, which may sit under a home that user cannot enter.
    impostor = await asyncio.create_subprocess_exec(
        shutil.which("sleep") or "sleep",
        "60",
        env=process_env(victim),
        cwd="/",
        user=other[0],
        group=other[1],
        extra_groups=[],
        start_new_session=True,
    )
    try:
        found = find_learners(victim.node, work)
        assert [f.handle for f in found] != [] and str(impostor.pid) not in [
            f.handle for f in found
        ]
    finally:
        impostor.kill()
        await impostor.wait()
        real.signal(signal.SIGKILL)
        await real.wait()


def test_a_results_location_that_leaves_its_root_is_refused_on_the_node(tmp_path: Path) -> None:
    root, outside = tmp_path / "results" / "acme", tmp_path / "elsewhere"
    root.mkdir(parents=True)
    outside.mkdir()
    # Accepted at submit, then turned into a symlink out of the root before the job runs.
    (root / "run").symlink_to(outside)
    (tmp_path / "work").mkdir()
    spec = spec_in(tmp_path / "work", "pass", None)
    shared = Shared(
        root / "run" / "x", (str(root),), "acme", True, "results.location", RESULTS_ROOTS_ENV
    )
    with pytest.raises(LearnerStartError, match=r"results\.location .* is not under a root"):
        prepare(replace(spec, shared=[shared]))


async def test_a_location_the_node_does_not_allow_fails_the_job_with_the_reason(
    twin: Twin, twin_agent: TwinAgent
) -> None:
    # Accepted by a control plane with other roots (or before the operator changed them): the
    # node checks again, and the attempt ends at once with the reason, never hangs.
    job_id = await twin.submit(
        [sys.executable, "-c", "print('never runs')"],
        results={"location": "file:///etc/trainyard-results"},
        deploy_retries=0,
        deploy_timeout_s=3600,
    )
    job = await twin.state(job_id, JobStatus.FAILED)
    assert job.failure_reason is not None
    assert "results.location '/etc/trainyard-results' is not under a root" in job.failure_reason
    await wait_for_line(twin, job_id, "learner 0 failed to start: results.location")
    assert "never runs" not in await twin.log_text(job_id)


def test_a_promoted_trial_takes_over_its_earlier_rung_s_files_and_nothing_else(
    tmp_path: Path,
) -> None:
    """A search trial's next rung runs as another user in the same checkpoint folder: what the
    rung before left (subfolders too) becomes its own; a symlink, a file with other hard links
    and the agent's own files do not."""
    earlier, later = (200_101, 200_101), (200_102, 200_102)
    folder = tmp_path / "checkpoints"
    (folder / "step-500").mkdir(parents=True)
    saved = folder / "step-500" / "ckpt.pt"
    saved.write_bytes(b"weights")
    secret = tmp_path / "agent-secret"
    secret.write_text("token")
    linked = folder / "linked"
    linked.write_text("x")
    os.link(linked, tmp_path / "elsewhere")
    (folder / "to-secret").symlink_to(secret)
    for path in (folder / "step-500", saved, linked):
        os.chown(path, *earlier)
    agent_file = folder / "agent-file"
    agent_file.write_text("the agent's")

    adopt_files(folder, later)

    assert (folder / "step-500").stat().st_uid == saved.stat().st_uid == later[0]
    assert linked.stat().st_uid == earlier[0]  # another hard link to it exists
    assert agent_file.stat().st_uid == os.geteuid() == secret.stat().st_uid
    assert (folder / "to-secret").lstat().st_uid == os.geteuid()
