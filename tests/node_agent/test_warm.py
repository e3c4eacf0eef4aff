"""Warm sandboxes (`node_agent.warm`), with real bubblewrap, cgroups and mounts: one is made
ahead as a uid held for its job, with nothing of any job in it; handed a learner, it runs it as
that job (its folders at their own paths, its cgroup's limits, its environment) and goes with
it; another job's never sees the first one's folders; one no learner took runs
nothing and leaves nothing; a restarted agent finds a learner started warm and removes the
warm sandboxes no learner took."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from uuid import uuid4

import pytest

from node_agent.learners import learner_dir
from node_agent.process_runtime import ProcessRuntime
from node_agent.runtime import ExitStatus, Folder, LearnerSpec, LearnerStartError, Mount, Place
from node_agent.sandbox import Sandbox
from node_agent.warm import FOLDER, WarmSandbox, WarmSandboxes, WarmSettings
from tests.cluster import learner_space
from tests.node_agent.test_sandbox import LOADED, cpu_of
from tests.polling import eventually

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only an agent that is root sandboxes")

LEARNER_UID = 200_655
LAUNCHER = (sys.executable, "-m", "runners.launch")
REPORT = """
import json, os, sys
with open("written", "w") as written:
    written.write("mine")
print(json.dumps({
    "uid": os.getuid(),
    "cwd": os.getcwd(),
    "job": os.environ.get("TRAINYARD_JOB_ID"),
    "warm_imports": os.environ.get("TRAINYARD_WARM_IMPORTS"),
    "preloaded": "colorsys" in sys.modules,
    "roots": sorted(os.listdir(sys.argv[1])),
}), flush=True)
while not os.path.exists("go"):
    import time; time.sleep(0.02)
"""
"""A learner that writes a file in its folder, reports what it sees (once the file is written:
its agent reads the report as soon as it is printed), then waits for the test's word (a file
`go`)."""


@pytest.fixture
def work_dir() -> Path:
    """Below a folder learners can pass through (`learner_space`), as an agent's."""
    path = learner_space() / "agent"
    path.mkdir(mode=0o711)
    return path


def runtime_of(work_dir: Path) -> ProcessRuntime:
    settings = WarmSettings(python=sys.executable, imports=("colorsys",), roots=(work_dir,))
    return ProcessRuntime(work_dir, warm=settings)


def sandboxes_of(runtime: ProcessRuntime) -> WarmSandboxes:
    assert runtime.warm is not None
    return runtime.warm


def spec_of(work_dir: Path, code: str = REPORT) -> LearnerSpec:
    job_id = uuid4()
    workdir = learner_dir(work_dir, job_id, 1, 0)
    checkpoints = work_dir / str(job_id) / "checkpoints"
    return LearnerSpec(
        job_id=job_id,
        attempt=1,
        learner=0,
        epoch=2,
        node=f"n-{job_id.hex[:8]}",
        image="unused",
        command=[*LAUNCHER, "--", sys.executable, "-c", code, str(work_dir)],
        env={"TRAINYARD_CHECKPOINT_DIR": str(checkpoints)},
        workdir=workdir,
        gpus=[],
        cpus=0.5,
        memory_mb=600,
        mounts=[Mount.same(checkpoints, writable=True)],
        user=(LEARNER_UID, LEARNER_UID),
        folders=[Folder(work_dir, workdir), Folder(work_dir, checkpoints)],
    )


async def started_warm(runtime: ProcessRuntime, warm: WarmSandbox, spec: LearnerSpec) -> object:
    sandboxes_of(runtime).hand(warm)
    return await runtime.start(replace(spec, warm=warm.name))


def status_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def mounted_below(path: Path) -> list[str]:
    """The mount points at or below `path`, as the kernel names them (real, octal-escaped)."""
    real = os.path.realpath(path).replace(" ", "\\040")
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [point for point in points if point.startswith(real)]


async def report_of(learner: object) -> dict[str, object]:
    import json

    async for line in learner.lines():  # type: ignore[attr-defined]
        if line.text.startswith("{"):
            report: dict[str, object] = json.loads(line.text)
            return report
    raise AssertionError("the learner reported nothing")


async def test_a_learner_started_warm_runs_as_its_job_in_a_sandbox_made_before_it(
    work_dir: Path,
) -> None:
    runtime = runtime_of(work_dir)
    sandboxes = sandboxes_of(runtime)
    warm = await sandboxes.make(uuid4(), LEARNER_UID)
    # Made ahead: as the uid held for its job, in a group of its own, and with nothing of any
    # job (no job's variable, so no secret).
    assert status_uid(warm.pid) == LEARNER_UID
    assert warm.pid in Sandbox.open().cgroups.group(warm.name).pids()
    assert not any(name.startswith("TRAINYARD_JOB") for name in environ(warm.pid))
    # Made at a loaded replica's CPU weight: what the node's learners leave.
    assert cpu_of(Sandbox.open().cgroups.group(warm.name)) == ("100000", LOADED)

    spec = spec_of(work_dir)
    learner = await started_warm(runtime, warm, spec)
    try:
        report = await report_of(learner)
        # Its job's uid, folder and environment (nothing left of the warm one's), what the
        # warm sandbox imported ahead, and of the agent's job root only its own job's folder.
        assert report == {
            "uid": LEARNER_UID,
            "cwd": str(spec.workdir),
            "job": str(spec.job_id),
            "warm_imports": None,
            "preloaded": True,
            "roots": [str(spec.job_id)],
        }
        assert (spec.workdir / "written").read_text() == "mine"
        # The sandbox's cgroup is the learner's now, with its limits.
        cgroup = Sandbox.open().cgroups.group(warm.name)
        assert warm.pid in cgroup.pids()
        memory = cgroup.memory / ("memory.max" if cgroup.version == 2 else "memory.limit_in_bytes")
        assert memory.read_text().strip() == str(600 << 20)
        assert cpu_of(cgroup) == ("50000", 1.0)  # its job's half CPU, a learner's weight
        (spec.workdir / "go").touch()
        assert await learner.wait() == ExitStatus(code=0)  # type: ignore[attr-defined]
    finally:
        learner.signal(signal.SIGKILL)  # type: ignore[attr-defined]
        await learner.remove()  # type: ignore[attr-defined]
    # It goes with its learner: no process, group, mount or folder left; the job's files stay.
    assert not cgroup.exists()
    assert mounted_below(work_dir / FOLDER) == []
    assert not (work_dir / FOLDER / warm.name).exists()
    assert (spec.workdir / "written").exists()


async def test_another_job_s_warm_sandbox_sees_nothing_of_the_first(work_dir: Path) -> None:
    runtime = runtime_of(work_dir)
    sandboxes = sandboxes_of(runtime)
    first = spec_of(work_dir)
    second = replace(spec_of(work_dir), user=(LEARNER_UID + 1, LEARNER_UID + 1))
    learner = await started_warm(runtime, await sandboxes.make(uuid4(), LEARNER_UID), first)
    other = await started_warm(runtime, await sandboxes.make(uuid4(), LEARNER_UID + 1), second)
    try:
        assert (await report_of(learner))["roots"] == [str(first.job_id)]
        assert (await report_of(other))["roots"] == [str(second.job_id)]
    finally:
        for started, spec in ((learner, first), (other, second)):
            (spec.workdir / "go").touch()
            await started.wait()  # type: ignore[attr-defined]
            await started.remove()  # type: ignore[attr-defined]


async def test_a_warm_sandbox_no_learner_took_runs_nothing_and_leaves_nothing(
    work_dir: Path,
) -> None:
    sandboxes = sandboxes_of(runtime_of(work_dir))
    warm = await sandboxes.make(uuid4(), LEARNER_UID)
    await sandboxes.discard(warm)
    assert warm.process.returncode is not None
    assert not Sandbox.open().cgroups.group(warm.name).exists()
    assert mounted_below(work_dir / FOLDER) == []
    assert list((work_dir / FOLDER).iterdir()) == []


async def test_a_warm_sandbox_whose_making_is_cancelled_leaves_nothing(work_dir: Path) -> None:
    # The agent stops while its pool makes one: once its folder's mount is made, say.
    making = asyncio.ensure_future(sandboxes_of(runtime_of(work_dir)).make(uuid4(), LEARNER_UID))

    async def mounted() -> bool:
        return mounted_below(work_dir / FOLDER) != []

    await eventually(mounted, seconds=60)
    [folder] = (work_dir / FOLDER).iterdir()
    making.cancel()
    with pytest.raises(asyncio.CancelledError):
        await making
    assert mounted_below(work_dir / FOLDER) == []
    assert not folder.exists()
    assert not Sandbox.open().cgroups.group(folder.name).exists()


async def test_a_restarted_agent_finds_a_learner_started_warm_and_removes_unused_ones(
    work_dir: Path,
) -> None:
    runtime = runtime_of(work_dir)
    sandboxes = sandboxes_of(runtime)
    unused = await sandboxes.make(uuid4(), LEARNER_UID + 1)
    spec = spec_of(work_dir)
    warm = await sandboxes.make(uuid4(), LEARNER_UID)
    learner = await started_warm(runtime, warm, spec)
    await report_of(learner)

    restarted = runtime_of(work_dir)  # another agent on the same work directory
    [found] = await restarted.find(spec.node)
    assert (found.job_id, found.attempt, found.learner, found.epoch) == (spec.job_id, 1, 0, 2)
    assert int(found.handle) in Sandbox.open().cgroups.group(warm.name).pids()
    # The sandbox no learner took is gone, with what ran in it.
    await eventually(lambda: _ended(unused.pid))
    assert not (work_dir / FOLDER / unused.name).exists()

    adopted = await restarted.adopt(spec, found)
    assert adopted is not None
    (spec.workdir / "go").touch()
    assert await adopted.wait() == ExitStatus(code=0)
    await adopted.remove()
    assert mounted_below(work_dir / FOLDER) == []
    assert list((work_dir / FOLDER).iterdir()) == []
    await learner.wait()  # type: ignore[attr-defined]


async def _ended(pid: int) -> bool:
    return _ended_now(pid)


def _ended_now(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def plant_link(link: Path, target: Path) -> None:
    target.mkdir()
    link.parent.mkdir(parents=True)
    link.symlink_to(target)


def test_only_a_learner_whose_sandbox_would_be_made_the_same_way_starts_warm(
    work_dir: Path,
) -> None:
    sandboxes = sandboxes_of(runtime_of(work_dir))
    spec = spec_of(work_dir)
    assert sandboxes.refusal(spec, LAUNCHER) is None
    place = Place(
        rank=0,
        world_size=2,
        local_rank=0,
        local_world_size=2,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=29500,
        timeout_s=60,
    )
    refused = {
        "network": replace(spec, network=True),
        "peers": replace(spec, place=place),
        "read-only folder": replace(spec, mounts=[Mount.same(work_dir / "x", writable=False)]),
        "environment": replace(spec, env={**spec.env, "PYTHONPATH": "/x"}),
        "launcher": replace(spec, command=["/bin/sh", "-c", "true"]),
        "outside": replace(spec, mounts=[Mount.same(Path("/srv/elsewhere"), writable=True)]),
    }
    reasons = {name: sandboxes.refusal(changed, LAUNCHER) for name, changed in refused.items()}
    assert all(reasons.values()), reasons
    assert "PYTHONPATH" in str(reasons["environment"])


async def test_a_warm_learner_whose_folder_is_a_link_fails_to_start_and_leaves_nothing(
    work_dir: Path, tmp_path: Path
) -> None:
    runtime = runtime_of(work_dir)
    sandboxes = sandboxes_of(runtime)
    warm = await sandboxes.make(uuid4(), LEARNER_UID)
    spec = spec_of(work_dir)
    # The checkpoint folder, a link to a folder of the node's: never what is bound.
    plant_link(Path(spec.env["TRAINYARD_CHECKPOINT_DIR"]), tmp_path / "secrets")
    with pytest.raises(LearnerStartError, match=r"is not a directory of the agent's"):
        await started_warm(runtime, warm, spec)
    assert _ended_now(warm.pid)
    assert mounted_below(work_dir / FOLDER) == []
    assert not (work_dir / FOLDER / warm.name).exists()


async def test_removing_a_warm_learner_leaves_its_job_s_files_whatever_the_work_dir_s_path(
    tmp_path: Path,
) -> None:
    # The agent's work directory reached through a symlinked folder, with a name mountinfo
    # escapes: what the kernel lists as mounted is another path than the agent's.
    space = learner_space()
    real = space / "real place"
    real.mkdir(mode=0o711)
    (space / "link").symlink_to(real)
    work_dir = space / "link" / "agent ü"
    work_dir.mkdir(mode=0o711)
    runtime = runtime_of(work_dir)
    spec = spec_of(work_dir)
    learner = await started_warm(
        runtime, await sandboxes_of(runtime).make(uuid4(), LEARNER_UID), spec
    )
    await report_of(learner)
    checkpoint = Path(spec.env["TRAINYARD_CHECKPOINT_DIR"]) / "weights"
    checkpoint.write_text("kept")
    (spec.workdir / "go").touch()
    await learner.wait()  # type: ignore[attr-defined]
    await learner.remove()  # type: ignore[attr-defined]
    assert (spec.workdir / "written").read_text() == "mine"
    assert checkpoint.read_text() == "kept"
    assert mounted_below(real) == []
    assert list((work_dir / FOLDER).iterdir()) == []


async def test_a_job_given_more_memory_than_a_warm_sandbox_is_made_with_starts_in_it(
    work_dir: Path,
) -> None:
    runtime = runtime_of(work_dir)
    spec = replace(spec_of(work_dir), memory_mb=8192)
    learner = await started_warm(
        runtime, await sandboxes_of(runtime).make(uuid4(), LEARNER_UID), spec
    )
    try:
        assert (await report_of(learner))["preloaded"] is True
    finally:
        (spec.workdir / "go").touch()
        await learner.wait()  # type: ignore[attr-defined]
        await learner.remove()  # type: ignore[attr-defined]


async def test_a_job_whose_memory_limit_is_below_what_a_warm_sandbox_holds_is_not_handed_it(
    work_dir: Path,
) -> None:
    # Its imports count against the job's limit once it is the learner's: a lower limit would
    # fail to be set (v1) or kill it (v2). The runtime then starts the learner cold (below).
    sandboxes = sandboxes_of(runtime_of(work_dir))
    warm = await sandboxes.make(uuid4(), LEARNER_UID)
    held = Sandbox.open().cgroups.group(warm.name).memory_used()
    assert held > 1 << 20
    spec = replace(spec_of(work_dir), memory_mb=1)
    with pytest.raises(LearnerStartError, match=r"memory limit \(1 MiB\) is below what"):
        await sandboxes.assign(warm, spec, {})
    # Removed whole, nothing of the job given to it.
    assert warm.process.returncode is not None
    assert not Sandbox.open().cgroups.group(warm.name).exists()
    assert not (work_dir / FOLDER / warm.name).exists()


async def test_a_learner_whose_warm_sandbox_ended_while_idle_starts_cold(work_dir: Path) -> None:
    runtime = runtime_of(work_dir)
    warm = await sandboxes_of(runtime).make(uuid4(), LEARNER_UID)
    os.kill(warm.pid, signal.SIGKILL)  # the node's OOM killer, say
    await eventually(lambda: _ended(warm.pid))
    spec = spec_of(work_dir)
    learner = await started_warm(runtime, warm, spec)
    try:
        report = await report_of(learner)
        assert (report["uid"], report["preloaded"]) == (LEARNER_UID, False)
    finally:
        (spec.workdir / "go").touch()
        assert await learner.wait() == ExitStatus(code=0)  # type: ignore[attr-defined]
        await learner.remove()  # type: ignore[attr-defined]
    assert not (work_dir / FOLDER / warm.name).exists()
