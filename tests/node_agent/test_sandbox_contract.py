"""The sandbox contract: what a learner can reach, run by both runtimes, each test a hostile
learner's probe. No network (not the cloud's metadata address, not the node's Postgres, not a
port the node listens on), no other process in /proc, no device node but its GPUs', a bounded
number of tasks, a memory limit for all its processes together, nothing writable outside its
folders (the system read-only, /tmp its own), and no privileges.

The process runtime needs an agent that is root (as the tests run) and the node's bubblewrap
(`./dev test` installs it); the Docker runtime an engine with the project's images (skipped
without one, failed on CI). Its GPUs are fake: for processes, device nodes the test makes and a
driver listing the test writes (node_agent/sandbox.py, GpuDevices); the engine is asked for none
(as for an agent's fake GPUs), so a container has no GPU node at all."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiodocker
import pytest

from node_agent.containers import PIDS_LIMIT
from node_agent.docker_runtime import DockerRuntime
from node_agent.images import LEARNER_IMAGE
from node_agent.learners import learner_dir
from node_agent.process_runtime import ProcessRuntime
from node_agent.runtime import ExitStatus, Folder, LearnerRuntime, LearnerSpec
from node_agent.sandbox import GpuDevices, Sandbox
from tests.docker_engine import node_name, remove_containers_of

LEARNER_UID = 200_789
NVIDIA_MAJOR = 195
GPUS = [f"GPU-{uuid.UUID(int=index + 1)}" for index in range(4)]
"""The node's fake GPUs; a learner gets the second and the fourth."""
MINIMAL_DEV = {
    *("null", "zero", "full", "random", "urandom", "tty", "console", "pts", "ptmx"),
    *("shm", "mqueue", "fd", "stdin", "stdout", "stderr", "core"),
}
"""What a container's /dev and bwrap's --dev hold besides GPUs (each has a subset)."""


@dataclass
class Box:
    """A runtime on a node of the test's own, and how learners are written for it."""

    kind: str
    runtime: LearnerRuntime
    name: str
    work_dir: Path
    python: str
    gpu_nodes: set[str]
    """The device nodes (names in /dev) a learner with the second and fourth GPU must see."""

    def spec(self, code: str, *args: str, **changes: Any) -> LearnerSpec:
        job_id = uuid.uuid4()
        workdir = learner_dir(self.work_dir, job_id, 1, 0)
        values: dict[str, Any] = {
            "job_id": job_id,
            "attempt": 1,
            "learner": 0,
            "epoch": 1,
            "node": self.name,
            "image": LEARNER_IMAGE,
            "command": [self.python, "-c", code, *args],
            "env": {},
            "workdir": workdir,
            "folders": [Folder(self.work_dir, workdir)],
            "user": (LEARNER_UID, LEARNER_UID),
            "gpus": [],
            "cpus": 1.0,
            "memory_mb": 512,
        }
        return LearnerSpec(**{**values, **changes})

    async def probe(self, code: str, *args: str, **changes: Any) -> tuple[Any, ExitStatus]:
        """Run `code` as a learner; what it printed last (JSON), and how it ended."""
        learner = await self.runtime.start(self.spec(code, *args, **changes))
        lines = [line async for line in learner.lines()]
        status = await learner.wait()
        await learner.remove()
        out = [line.text for line in lines if line.stream == "stdout"]
        assert out, f"the probe printed nothing ({status.describe()}): {lines}"
        return json.loads(out[-1]), status


@pytest.fixture(params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "docker":
        request.getfixturevalue("docker_engine")  # skips (on CI: fails) without an engine
    elif os.geteuid() != 0:
        pytest.skip("the process runtime sandboxes learners of an agent that is root")
    kind: str = request.param
    return kind


@pytest.fixture
def fake_gpus(tmp_path: Path) -> GpuDevices:
    """Four GPUs as the NVIDIA driver lists them, with device nodes (which no driver answers)."""
    driver, dev = tmp_path / "driver", tmp_path / "dev"
    dev.mkdir()
    for minor, gpu in enumerate(GPUS):
        folder = driver / f"0000:0{minor}:00.0"
        folder.mkdir(parents=True)
        (folder / "information").write_text(
            f"Model: \t\t Fake GPU\nGPU UUID: \t {gpu}\nDevice Minor: \t {minor}\n"
        )
        os.mknod(dev / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
    os.mknod(dev / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, 255))
    os.mknod(dev / "nvidia-uvm", 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR + 40, 0))
    return GpuDevices(driver=driver, dev=dev)


@pytest.fixture
async def box(kind: str, tmp_path: Path, fake_gpus: GpuDevices) -> AsyncIterator[Box]:
    name = node_name()
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    if kind == "process":
        processes = ProcessRuntime(work_dir, Sandbox.open(gpus=fake_gpus))
        nodes = {"nvidia1", "nvidia3", "nvidiactl", "nvidia-uvm"}
        yield Box(kind, processes, name, work_dir, sys.executable, nodes)
        return
    async with aiodocker.Docker() as docker:
        # Fake GPUs are not the engine's to hand out (as for an agent with --fake-gpus).
        containers = DockerRuntime(docker, request_gpus=False)
        yield Box(kind, containers, name, work_dir, "python3", set())
    remove_containers_of(name)


@pytest.fixture
def listener() -> Iterator[int]:
    """A port the node listens on, on every address."""
    with socket.create_server(("0.0.0.0", 0)) as server:
        yield server.getsockname()[1]


def node_address() -> str | None:
    """The node's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        try:
            udp.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address: str = udp.getsockname()[0]
        return address


def postgres_target(url: str) -> list[str]:
    """Where the node's Postgres answers: `tcp:HOST:PORT` or `unix:PATH`."""
    parts = urlsplit(url)
    port = parts.port or 5432
    host = parts.hostname or parse_qs(parts.query).get("host", ["/run/postgresql"])[0]
    if host.startswith("/"):
        return [f"unix:{host}/.s.PGSQL.{port}"]
    return [f"tcp:{host}:{port}"]


NETWORK_PROBE = """
import json, socket, sys
seen = {}
for target in sys.argv[1:]:
    kind, _, where = target.partition(":")
    try:
        if kind == "unix":
            conn = socket.socket(socket.AF_UNIX)
            conn.settimeout(3)
            conn.connect(where)
        else:
            host, _, port = where.rpartition(":")
            conn = socket.create_connection((host, int(port)), timeout=3)
        conn.close()
        seen[target] = "connected"
    except OSError as exc:
        seen[target] = type(exc).__name__
print(json.dumps(seen))
"""


async def test_the_learner_reaches_no_network(box: Box, listener: int, pg_server: str) -> None:
    targets = [
        "tcp:169.254.169.254:80",  # a cloud's metadata service (credentials)
        f"tcp:127.0.0.1:{listener}",  # the node's own services (the API, an agent)
        *postgres_target(pg_server),
    ]
    if (address := node_address()) is not None:
        targets.append(f"tcp:{address}:{listener}")
    seen, status = await box.probe(NETWORK_PROBE, *targets)
    assert status == ExitStatus(code=0)
    assert set(seen) == set(targets)
    assert [target for target, how in seen.items() if how == "connected"] == []


PROC_PROBE = """
import json, os, sys
marker = sys.argv[1][::-1]  # given reversed: its own command line does not hold it
pids = [name for name in os.listdir("/proc") if name.isdigit()]
seen = False
for pid in pids:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            seen = seen or marker.encode() in cmdline.read()
    except OSError:
        pass
print(json.dumps({"pids": len(pids), "seen": seen}))
"""


async def test_proc_shows_the_learner_no_other_process(box: Box) -> None:
    # Another job's learner, with a secret on its command line.
    marker = f"secret-{uuid.uuid4().hex}"
    other = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)", marker
    )
    try:
        found, _ = await box.probe(PROC_PROBE, marker[::-1])
    finally:
        other.kill()
        await other.wait()
    assert found["seen"] is False
    # Itself, and the process runtime's init (bwrap's, which reaps orphans).
    assert found["pids"] <= 2


DEV_PROBE = """
import json, os
print(json.dumps({"dev": sorted(os.listdir("/dev")), "cuda": os.environ["CUDA_VISIBLE_DEVICES"]}))
"""


async def test_the_learner_sees_a_minimal_dev_and_its_own_gpus_alone(box: Box) -> None:
    mine = [GPUS[1], GPUS[3]]
    found, _ = await box.probe(DEV_PROBE, gpus=mine)
    dev = set(found["dev"])
    assert found["cuda"] == ",".join(mine)
    assert dev - MINIMAL_DEV == box.gpu_nodes
    assert {"null", "zero", "urandom"} <= dev


PIDS_PROBE = f"""
import json, threading
threading.stack_size(64 * 1024)
stop = threading.Event()
started = 0
try:
    # Threads are tasks as processes are: a fork bomb's cost, without its memory.
    for _ in range({PIDS_LIMIT + 300}):
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
except RuntimeError:
    pass
stop.set()
print(json.dumps({{"started": started}}))
"""


async def test_a_fork_bomb_is_bounded(box: Box) -> None:
    found, _ = await box.probe(PIDS_PROBE, memory_mb=1024)
    assert PIDS_LIMIT - 100 < found["started"] < PIDS_LIMIT


MEMORY_PROBE = """
import json, os, select, time
SIZE = 160 << 20
children = {}
for _ in range(3):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        block = b"\\1" * SIZE  # every page written: resident, not only reserved
        os.write(write, b"x")
        time.sleep(60)
        os._exit(0)
    os.close(write)
    children[read] = pid
holding, deadline = [], time.monotonic() + 30
readers = list(children)
while readers and time.monotonic() < deadline:
    ready, _, _ = select.select(readers, [], [], 1)
    for read in ready:
        if os.read(read, 1) == b"x":  # nothing: killed before it held its block
            holding.append(children[read])
        readers.remove(read)
# Those still alive hold their blocks now, together (the OOM killer may have taken one that
# held its block for the next to hold its own).
alive = [pid for pid in holding if os.waitpid(pid, os.WNOHANG) == (0, 0)]
for pid in children.values():
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass
print(json.dumps({"held": len(alive)}))
"""


async def test_the_memory_limit_holds_for_all_of_the_learner_s_processes(box: Box) -> None:
    # Three processes of 160 MiB each under a limit of 256 MiB for the learner: one may hold
    # its block, never two.
    found, _ = await box.probe(MEMORY_PROBE, memory_mb=256)
    assert found["held"] <= 1


DISK_PROBE = """
import json, os, sys
planted, name = sys.argv[1], sys.argv[2]
wrote = {}
for folder in ("/", "/usr", "/etc", "/var/tmp", "/tmp", os.getcwd()):
    try:
        with open(os.path.join(folder, name), "w") as file:
            file.write("the learner's")
        wrote[folder] = "written"
    except OSError as exc:
        wrote[folder] = type(exc).__name__
print(json.dumps({"wrote": wrote, "sees_planted": os.path.exists(planted)}))
"""


async def test_the_learner_writes_only_in_its_folders_and_its_own_tmp(box: Box) -> None:
    name = f"trainyard-probe-{uuid.uuid4().hex}"
    planted = Path("/tmp") / f"{name}-node"
    planted.write_text("the node's")
    planted.chmod(0o644)
    try:
        found, _ = await box.probe(DISK_PROBE, str(planted), name)
        assert not (Path("/tmp") / name).exists(), "its /tmp is the node's"
        assert not (Path("/var/tmp") / name).exists()
    finally:
        planted.unlink()
        for folder in ("/tmp", "/var/tmp"):
            (Path(folder) / name).unlink(missing_ok=True)
    wrote = found["wrote"]
    cwd = next(folder for folder in wrote if folder.startswith(str(box.work_dir)))
    assert {folder: how == "written" for folder, how in wrote.items()} == {
        "/": False,
        "/usr": False,
        "/etc": False,
        "/var/tmp": False,
        "/tmp": True,
        cwd: True,
    }
    assert found["sees_planted"] is False


PRIVILEGES_PROBE = """
import json, os
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
wanted = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  **{name: status[name].strip() for name in wanted}}))
"""


async def test_the_learner_runs_as_its_user_without_any_privilege(box: Box) -> None:
    found, _ = await box.probe(PRIVILEGES_PROBE)
    none = "0" * 16
    assert found["groups"] in ([], [LEARNER_UID])
    assert {**found, "groups": None} == {
        "uid": LEARNER_UID,
        "gid": LEARNER_UID,
        "groups": None,
        "CapInh": none,
        "CapPrm": none,
        "CapEff": none,
        "CapBnd": none,
        "CapAmb": none,
        "NoNewPrivs": "1",
    }


RENDEZVOUS_PORT = 29_501
LISTENER = """
import json, socket
with socket.create_server(("127.0.0.1", int(__import__("sys").argv[1]))) as server:
    server.settimeout(30)
    print("listening", flush=True)
    conn, _ = server.accept()
    conn.close()
print(json.dumps({"accepted": True}))
"""


async def test_a_job_s_learners_reach_each_other_on_127_0_0_1_and_another_job_s_do_not(
    box: Box,
) -> None:
    if box.kind != "process":
        pytest.skip("containers meet on their job's Docker network (test_docker_runtime)")
    port = str(RENDEZVOUS_PORT)
    # Rank 0 of job A, keeping its rendezvous on 127.0.0.1 (MASTER_ADDR, see node_agent.rendezvous).
    first = box.spec(LISTENER, port)
    chief = await box.runtime.start(first)
    lines = aiter(chief.lines())
    async with asyncio.timeout(30):
        while (await anext(lines)).text != "listening":
            pass
    # A learner of job B, on the same node, at the same address and port: refused, its
    # 127.0.0.1 is its own job's.
    stranger, status = await box.probe(NETWORK_PROBE, f"tcp:127.0.0.1:{port}")
    assert status == ExitStatus(code=0)
    assert stranger == {f"tcp:127.0.0.1:{port}": "ConnectionRefusedError"}
    # Rank 1 of job A reaches it.
    workdir = learner_dir(box.work_dir, first.job_id, 1, 1)
    peer, status = await box.probe(
        NETWORK_PROBE,
        f"tcp:127.0.0.1:{port}",
        job_id=first.job_id,
        learner=1,
        workdir=workdir,
        folders=[Folder(box.work_dir, workdir)],
    )
    assert peer == {f"tcp:127.0.0.1:{port}": "connected"}
    rest = [line.text async for line in lines]
    assert await chief.wait() == ExitStatus(code=0), rest
    assert json.loads(rest[-1]) == {"accepted": True}
    await chief.remove()
