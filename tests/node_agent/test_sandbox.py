"""The process runtime's sandbox as only it has it (what both runtimes promise is in
test_sandbox_contract.py): an agent that is root refuses to run learners as processes without
bubblewrap; each learner's cgroup has its manifest's limits and goes when the learner does; an
OOM kill is reported as one; a tenant allowed the network keeps the node's; and an agent that
adopts a learner reads its files without following a link the job's code planted."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest

from controlplane.jobs.images import ImageAllowlist
from node_agent.cgroups import Cgroup
from node_agent.containers import PIDS_LIMIT
from node_agent.learners import learner_dir
from node_agent.process_runtime import EXIT_STATUS_FILE, ProcessRuntime
from node_agent.runtime import LOADED_WEIGHT, CpuShare, ExitStatus, Folder, LearnerSpec
from node_agent.runtimes import open_runtime
from node_agent.sandbox import CLEAR_S, Sandbox, SandboxMissing, cgroup_name

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only an agent that is root sandboxes")

LEARNER_UID = 200_654

WAIT_FOR_GO = (
    "import os, time\nprint('up', flush=True)\nwhile not os.path.exists('go'): time.sleep(0.02)\n"
)


def spec_of(work_dir: Path, code: str, **changes: object) -> LearnerSpec:
    job_id = uuid4()
    workdir = learner_dir(work_dir, job_id, 1, 0)
    values: dict[str, object] = {
        "job_id": job_id,
        "attempt": 1,
        "learner": 0,
        "epoch": 3,
        "node": f"n-{job_id.hex[:8]}",
        "image": "unused",
        "command": [sys.executable, "-c", code],
        "env": {},
        "workdir": workdir,
        "folders": [Folder(work_dir, workdir)],
        "user": (LEARNER_UID, LEARNER_UID),
        "gpus": [],
        "cpus": 0.5,
        "memory_mb": 300,
    }
    return LearnerSpec(**{**values, **changes})  # type: ignore[arg-type]


def cgroup_of(spec: LearnerSpec) -> Cgroup:
    name = cgroup_name(spec.job_id, spec.attempt, spec.learner, spec.epoch)
    return Sandbox.open().cgroups.group(name)


def limits_of(cgroup: Cgroup) -> tuple[str, str, str]:
    """Its CPU quota (microseconds a period), memory limit (bytes) and pids ceiling."""
    cpu, memory, pids = (cgroup.folders[c] for c in ("cpu", "memory", "pids"))
    if cgroup.version == 2:
        quota = (cpu / "cpu.max").read_text().split()[0]
        return quota, (memory / "memory.max").read_text().strip(), (pids / "pids.max").read_text()
    return (
        (cpu / "cpu.cfs_quota_us").read_text().strip(),
        (memory / "memory.limit_in_bytes").read_text().strip(),
        (pids / "pids.max").read_text(),
    )


async def test_a_root_agent_without_bubblewrap_refuses_to_run_learners_as_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the agent opens when it chose processes, asked for or because no Docker engine
    # answered: a node without bwrap runs no tenant code at all.
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxMissing, match=r"bwrap not found: apt-get install bubblewrap"):
        async with open_runtime(
            "process", work_dir=tmp_path, request_gpus=False, images=ImageAllowlist.from_env({})
        ):
            pass


async def test_a_learner_runs_in_a_cgroup_with_its_limits_which_goes_with_it(
    tmp_path: Path,
) -> None:
    runtime = ProcessRuntime(tmp_path)
    spec = spec_of(tmp_path, WAIT_FOR_GO)
    learner = await runtime.start(spec)
    cgroup = cgroup_of(spec)
    try:
        assert (await anext(aiter(learner.lines()))).text == "up"
        assert limits_of(cgroup) == ("50000", str(300 << 20), f"{PIDS_LIMIT}\n")
        [found] = await runtime.find(spec.node)
        assert int(found.handle) in cgroup.pids()
        (spec.workdir / "go").touch()
        assert await learner.wait() == ExitStatus(code=0)
    finally:
        learner.signal(signal.SIGKILL)  # nothing outlives a failed test
        await learner.remove()
    assert not cgroup.exists()


def cpu_of(cgroup: Cgroup) -> tuple[str, float]:
    """Its CPU quota (microseconds a period; "max" for none) and its weight against a
    learner's, to two places (v1's shares of 1024 and v2's weight of 100 are a learner's)."""
    cpu = cgroup.folders["cpu"]
    if cgroup.version == 2:
        quota, _period = (cpu / "cpu.max").read_text().split()
        return quota, round(int((cpu / "cpu.weight").read_text()) / 100, 2)
    quota = (cpu / "cpu.cfs_quota_us").read_text().strip()
    shares = int((cpu / "cpu.shares").read_text())
    return ("max" if quota == "-1" else quota), round(shares / 1024, 2)


LOADED = round(LOADED_WEIGHT, 2)


async def test_a_replica_loading_its_model_has_no_cpu_quota_and_a_loaded_one_a_low_weight(
    tmp_path: Path,
) -> None:
    runtime = ProcessRuntime(tmp_path)
    spec = spec_of(tmp_path, WAIT_FOR_GO)
    learner = await runtime.start(spec)
    cgroup = cgroup_of(spec)
    try:
        assert (await anext(aiter(learner.lines()))).text == "up"
        # Started as every learner: its own half CPU, a learner's weight.
        assert cpu_of(cgroup) == ("50000", 1.0)
        await learner.share_cpu(CpuShare.LOADING)
        assert cpu_of(cgroup) == ("max", 1.0)
        await learner.share_cpu(CpuShare.SERVING)
        assert cpu_of(cgroup) == ("50000", LOADED)
        # A restarted agent's hold on it does the same (its quota comes from its spec).
        await learner.share_cpu(CpuShare.LOADING)
        adopted = await runtime.adopt(spec, None)
        assert adopted is not None
        await adopted.share_cpu(CpuShare.SERVING)
        assert cpu_of(cgroup) == ("50000", LOADED)
        (spec.workdir / "go").touch()
        assert await learner.wait() == ExitStatus(code=0)
        # An ended learner's group is left as it was (it is about to go).
        await learner.share_cpu(CpuShare.LOADING)
        assert cpu_of(cgroup) == ("50000", LOADED)
    finally:
        learner.signal(signal.SIGKILL)
        await learner.remove()


async def test_a_learner_killed_for_its_memory_is_reported_as_oom_killed(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "block = b'1' * (600 << 20)\nprint('held')", memory_mb=128)
    learner = await ProcessRuntime(tmp_path).start(spec)
    assert [line.text async for line in learner.lines()] == []
    status = await learner.wait()
    assert (status.signal, status.oom_killed) == ("SIGKILL", True)
    assert "OOM" in status.describe()
    await learner.remove()


async def test_a_stale_learner_is_killed_with_its_cgroup(tmp_path: Path) -> None:
    runtime = ProcessRuntime(tmp_path)
    spec = spec_of(tmp_path, WAIT_FOR_GO + "print('never')")
    learner = await runtime.start(spec)
    try:
        assert (await anext(aiter(learner.lines()))).text == "up"
        [found] = await runtime.find(spec.node)
        assert int(found.handle) in cgroup_of(spec).pids()
        await runtime.kill(found)  # its job moved on while its agent was down
        assert (await asyncio.wait_for(learner.wait(), 10)).signal == "SIGKILL"
        assert not cgroup_of(spec).exists()
    finally:
        learner.signal(signal.SIGKILL)
        await learner.remove()


async def test_a_learner_removed_while_it_runs_is_killed_with_its_cgroup_at_once(
    tmp_path: Path,
) -> None:
    # The attempt ended without it (the agent's own error): its removal does not wait for the
    # sandbox to end by itself, as it does for one that has ended (its init tearing down).
    spec = spec_of(tmp_path, WAIT_FOR_GO)
    learner = await ProcessRuntime(tmp_path).start(spec)
    try:
        assert (await anext(aiter(learner.lines()))).text == "up"
        async with asyncio.timeout(CLEAR_S / 2):
            await learner.remove()
        assert not cgroup_of(spec).exists()
        assert (await asyncio.wait_for(learner.wait(), 10)).signal == "SIGKILL"
    finally:
        learner.signal(signal.SIGKILL)
        await learner.remove()


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


async def test_a_tenant_allowed_the_network_keeps_the_node_s(tmp_path: Path, listener: int) -> None:
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=5).close()"
    for network, code_wanted in ((True, 0), (False, 1)):
        spec = spec_of(tmp_path, code, network=network)
        learner = await ProcessRuntime(tmp_path).start(spec)
        assert (await learner.wait()).code == code_wanted
        await learner.remove()


async def test_an_adopting_agent_follows_no_folder_the_job_s_code_swapped_for_a_link(
    tmp_path: Path,
) -> None:
    runtime = ProcessRuntime(tmp_path)
    spec = spec_of(tmp_path, "print('mine')")
    learner = await runtime.start(spec)
    assert [line.text async for line in learner.lines()] == ["mine"]
    assert await learner.wait() == ExitStatus(code=0)
    await learner.remove()
    # The job owns its attempt's folder (where it sees it: an agent that is not root, a
    # checkpoint volume shared with another of its learners): it puts a link there, to a
    # folder of the node's laid out as a learner's.
    decoy = tmp_path / "decoy"
    (decoy / "learner-0").mkdir(parents=True)
    (decoy / "learner-0" / "stdout.log").write_text("the agent's secret\n")
    (decoy / "learner-0" / "stderr.log").write_text("")
    (decoy / "learner-0" / EXIT_STATUS_FILE).write_text("42\n")
    attempt = spec.workdir.parent
    attempt.rename(attempt.with_name("moved"))
    attempt.symlink_to(decoy)
    # An agent that restarts adopts the learner that ended: it reads nothing through the link.
    adopted = await runtime.adopt(spec, None)
    assert adopted is not None
    assert [line.text async for line in adopted.lines()] == []
    assert await adopted.wait() == ExitStatus(code=None)
    shutil.rmtree(decoy)
