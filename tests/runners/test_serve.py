"""The serving replica (`python -m runners.serve`) as a real process, driven by the agent's
`ReplicaClient`; and the pure parts under it: frames and unpacking a ZIP artifact."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import signal
import stat
import struct
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from learner_process import LAUNCH, PATIENCE_S, PYTHON, Learner, StartLearner

from node_agent.replica_client import ReplicaClient, ReplicaError, ReplicaGone
from runners.config import CPUS, SERVE_DIR
from runners.frames import MAX_FRAME, FrameError, read_frame, read_message
from runners.inputs import generated
from runners.servable import ServableError, unpack_zip
from runners.serve import LOADED_NICE, SOCKET_NAME

MLP = """
from pathlib import Path

import torch

# One thread, here and in the test: the same operations on the same data then give the same
# bits (a different split of a matrix product across threads may round differently).
torch.set_num_threads(1)
_model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
_model.load_state_dict(torch.load(Path(__file__).with_name("weights.pt"), weights_only=True))
_model.eval()


def predict(items):
    with torch.inference_mode():
        return _model(torch.tensor(items, dtype=torch.float32))
"""

RULES = """
import os

import numpy


class Doubler:
    def __init__(self):
        self.calls = 0

    def predict(self, items):
        self.calls += 1
        return [[2 * item, self.calls] for item in items]


def invert(items):
    return [1 / item for item in items]


def too_few(items):
    return items[:-1]


def not_json(items):
    return [numpy.arange(3), {1, 2}]


def die(items):
    os._exit(3)
"""


@dataclass
class Replica:
    process: Learner
    directory: Path
    below: Path
    """The folder standing for the agent's work directory, which holds the replica's."""


@pytest.fixture
def replica(start_learner: StartLearner, tmp_path: Path) -> Replica:
    # Longer than a socket's path may be (108 bytes): only a relative bind and the client's
    # descriptor-relative connect reach it.
    directory = tmp_path / ("d" * 60) / ("e" * 60) / "serve"
    directory.mkdir(parents=True, mode=0o700)
    assert len(str(directory / SOCKET_NAME)) > 108
    return Replica(
        start_learner((PYTHON, "-m", "runners.serve"), {SERVE_DIR: directory}), directory, tmp_path
    )


@pytest.fixture
def torch_single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


async def connect(replica: Replica) -> ReplicaClient:
    return await ReplicaClient.connect(replica.below, replica.directory, timeout_s=PATIENCE_S)


def artifact(path: Path, content: bytes) -> tuple[Path, str]:
    path.write_bytes(content)
    return path, hashlib.sha256(content).hexdigest()


def files_named(root: Path, name: str) -> list[Path]:
    return list(root.rglob(name))


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name, content in members.items():
            bundle.writestr(zipfile.ZipInfo(name), content)
    return buffer.getvalue()


async def test_a_zipped_torch_model_gives_exactly_the_outputs_computed_here(
    replica: Replica, tmp_path: Path, torch_single_thread: None
) -> None:
    generator = torch.Generator().manual_seed(7)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    ).eval()
    for parameter in model.parameters():
        parameter.data = torch.randn(parameter.shape, generator=generator)
    weights = io.BytesIO()
    torch.save(model.state_dict(), weights)
    path, sha256 = artifact(
        tmp_path / "mlp.zip", zip_bytes({"mlp.py": MLP.encode(), "weights.pt": weights.getvalue()})
    )
    # float32 values as Python floats: JSON carries them without loss, both ways.
    items = torch.rand(8, 784, generator=generator).tolist()
    with torch.inference_mode():
        expected = model(torch.tensor(items, dtype=torch.float32)).tolist()

    client = await connect(replica)
    assert await client.hello() is False
    assert await client.load(path, sha256, "mlp:predict") > 0
    outputs, inference_ms = await client.predict(items)
    await client.close()

    assert outputs == expected  # exactly: same weights, same operations, one thread each
    assert inference_ms > 0


async def test_a_single_module_with_a_class_is_instantiated_once(
    replica: Replica, tmp_path: Path
) -> None:
    path, sha256 = artifact(tmp_path / "rules.py", RULES.encode())
    client = await connect(replica)
    await client.load(path, sha256, "rules:Doubler.predict")

    assert (await client.predict([1, 2.5]))[0] == [[2, 1], [5.0, 1]]
    assert (await client.predict([3]))[0] == [[6, 2]]
    await client.close()


async def test_user_errors_come_back_as_tracebacks_and_serving_goes_on(
    replica: Replica, tmp_path: Path
) -> None:
    path, sha256 = artifact(tmp_path / "rules.py", RULES.encode())
    client = await connect(replica)
    with pytest.raises(ReplicaError, match="no model loaded"):
        await client.predict([1])
    await client.load(path, sha256, "rules:invert")

    with pytest.raises(ReplicaError) as raised:
        await client.predict([1, 0])
    assert "Traceback" in str(raised.value)
    assert "ZeroDivisionError" in str(raised.value)
    assert (await client.predict([1, 4]))[0] == [1.0, 0.25]
    await client.close()


async def test_outputs_that_break_the_rules_are_refused_with_what_was_wrong(
    replica: Replica, tmp_path: Path
) -> None:
    path, sha256 = artifact(tmp_path / "rules.py", RULES.encode())
    client = await connect(replica)

    await client.load(path, sha256, "rules:too_few")
    with pytest.raises(ReplicaError, match="predict returned 2 outputs for 3 items"):
        await client.predict([1, 2, 3])
    # A second load replaces the first: the module is imported afresh, not found in the cache.
    await client.load(path, sha256, "rules:not_json")
    with pytest.raises(ReplicaError, match="output 1 is a set, not JSON"):
        await client.predict([1, 2])
    await client.close()


async def test_a_replica_that_dies_mid_batch_is_gone(replica: Replica, tmp_path: Path) -> None:
    path, sha256 = artifact(tmp_path / "rules.py", RULES.encode())
    client = await connect(replica)
    await client.load(path, sha256, "rules:die")

    with pytest.raises(ReplicaGone):
        await client.predict([1])
    with pytest.raises(ReplicaGone):
        await client.hello()
    assert await asyncio.to_thread(replica.process.finish) == 3


async def test_bad_artifacts_are_refused_and_nothing_lands_outside(
    replica: Replica, tmp_path: Path
) -> None:
    good, good_sha256 = artifact(tmp_path / "rules.py", RULES.encode())
    slip, slip_sha256 = artifact(
        tmp_path / "slip.zip", zip_bytes({"ok.py": b"", "../evil.py": b"print('escaped')"})
    )
    client = await connect(replica)

    with pytest.raises(ReplicaError, match="sha256"):
        await client.load(good, "0" * 64, "rules:invert")
    assert await client.hello() is False
    with pytest.raises(ReplicaError, match=r"climbs out"):
        await client.load(slip, slip_sha256, "ok:predict")
    assert await client.hello() is False
    assert not files_named(tmp_path, "evil.py")
    with pytest.raises(ReplicaError, match="must be a plain name"):
        await client.load(good, good_sha256, "models.rules:invert")
    shadow, shadow_sha256 = artifact(tmp_path / "json.py", RULES.encode())
    with pytest.raises(ReplicaError, match="not the artifact's"):
        await client.load(shadow, shadow_sha256, "json:invert")
    # Still serving, and able to load a good one.
    await client.load(good, good_sha256, "rules:invert")
    assert (await client.predict([2]))[0] == [0.5]
    await client.close()


async def test_a_reconnecting_agent_finds_the_model_still_loaded(
    replica: Replica, tmp_path: Path
) -> None:
    path, sha256 = artifact(tmp_path / "rules.py", RULES.encode())
    client = await connect(replica)
    await client.load(path, sha256, "rules:invert")
    await client.close()
    with pytest.raises(ReplicaGone):
        await client.predict([1])

    client = await connect(replica)
    assert await client.hello() is True
    assert (await client.predict([8]))[0] == [0.125]
    await client.close()


async def test_sigterm_ends_the_replica_promptly_with_status_0(replica: Replica) -> None:
    client = await connect(replica)
    assert await client.hello() is False  # listening, and blocked reading the next request

    started = time.monotonic()
    replica.process.process.send_signal(signal.SIGTERM)
    status = await asyncio.to_thread(replica.process.finish)

    assert status == 0
    assert time.monotonic() - started < 5
    assert not (replica.directory / SOCKET_NAME).exists()
    assert "listening" in replica.process.output()
    await client.close()


async def test_connecting_gives_up_after_its_timeout(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError):
        await ReplicaClient.connect(tmp_path, tmp_path / "serve", timeout_s=0.2)


# Frames ---------------------------------------------------------------------------------------


def stream_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_an_oversize_announced_length_is_refused_before_reading() -> None:
    with pytest.raises(FrameError, match="more than the limit"):
        await read_frame(stream_of(struct.pack(">I", MAX_FRAME + 1)))


async def test_frames_end_cleanly_only_between_frames() -> None:
    reader = stream_of(struct.pack(">I", 2) + b"ok")
    assert await read_frame(reader) == b"ok"
    assert await read_frame(reader) is None
    with pytest.raises(FrameError, match="ended after 1 of"):
        await read_frame(stream_of(struct.pack(">I", 2) + b"o"))
    with pytest.raises(FrameError, match="header"):
        await read_frame(stream_of(b"\x00\x00"))


@pytest.mark.parametrize("payload", [b"[1]", b"not json", b'{"x": NaN}', b"\xff"])
async def test_a_message_is_a_json_object(payload: bytes) -> None:
    with pytest.raises(FrameError):
        await read_message(stream_of(struct.pack(">I", len(payload)) + payload))


async def test_a_large_message_is_decoded_off_the_event_loop() -> None:
    # A replica's answer of tens of MiB takes a while to parse: the agent's loop (heartbeats,
    # other replicas) must go on meanwhile. The payload is buffered whole, so a decode on the
    # loop would never let the ticker run.
    payload = json.dumps({"op": "done", "outputs": ["x" * 100] * 200_000}).encode()
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    reader = stream_of(struct.pack(">I", len(payload)) + payload)
    async with asyncio.TaskGroup() as group:
        group.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        message = await read_message(reader)
        during = ticks - before
        stop.set()
    assert message is not None and len(message["outputs"]) == 200_000
    assert during > 1


# Unpacking a ZIP artifact ---------------------------------------------------------------------


def zipped(tmp_path: Path, *members: zipfile.ZipInfo) -> Path:
    path = tmp_path / "artifact.zip"
    with zipfile.ZipFile(path, "w") as bundle:
        for member in members:
            bundle.writestr(member, b"" if member.is_dir() else b"x" * 10)
    return path


def symlink(name: str) -> zipfile.ZipInfo:
    member = zipfile.ZipInfo(name)
    member.external_attr = (stat.S_IFLNK | 0o777) << 16
    return member


@pytest.mark.parametrize(
    ("members", "limits", "reason"),
    [
        ([zipfile.ZipInfo("/etc/evil.py")], {}, "absolute name"),
        ([zipfile.ZipInfo("pkg/../../evil.py")], {}, "climbs out"),
        ([symlink("link")], {}, "is a symlink"),
        ([zipfile.ZipInfo(f"m{n}.py") for n in range(3)], {"max_members": 2}, "3 members"),
        ([zipfile.ZipInfo(f"m{n}.py") for n in range(3)], {"max_bytes": 25}, "declares 30"),
        ([zipfile.ZipInfo("m.py"), zipfile.ZipInfo("m.py")], {}, "File exists"),
    ],
)
@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_hostile_archives_are_refused(
    tmp_path: Path, members: list[zipfile.ZipInfo], limits: dict[str, int], reason: str
) -> None:
    archive = zipped(tmp_path, *members)
    code = tmp_path / "code"
    with pytest.raises(ServableError, match=reason):
        unpack_zip(archive, code, **limits)
    files = [path for path in tmp_path.rglob("*") if path.is_file() and code not in path.parents]
    assert files == [archive]


def test_a_plain_archive_unpacks_whole(tmp_path: Path) -> None:
    archive = zipped(tmp_path, zipfile.ZipInfo("pkg/"), zipfile.ZipInfo("pkg/./m.py"))
    unpack_zip(archive, tmp_path / "code", max_members=2, max_bytes=10)
    assert (tmp_path / "code" / "pkg" / "m.py").read_bytes() == b"x" * 10


GENERATED = """
import torch


def shapes(items):
    return [[list(item.shape), round(float(item.sum()), 4)] for item in items]
"""


async def test_generated_items_are_made_by_the_replica_from_the_seed_and_their_numbers(
    replica: Replica, tmp_path: Path
) -> None:
    path, sha256 = artifact(tmp_path / "gen.py", GENERATED.encode())
    client = await connect(replica)
    await client.load(path, sha256, "gen:shapes")
    outputs, _ = await client.predict_generated({"shape": [2, 3], "seed": 5}, 3, 2)
    expected = [[[2, 3], round(float(generated([2, 3], 5, n).sum()), 4)] for n in (3, 4)]
    assert outputs == expected
    with pytest.raises(ReplicaError, match="cannot generate the batch's items"):
        await client.predict_generated({"shape": [0], "seed": 5}, 0, 2)
    with pytest.raises(ReplicaError, match="cannot generate the batch's items"):
        await client.predict_generated({"shape": "3x3", "seed": 5}, 0, 2)
    # A module importing torch loads again into the same replica (torch's modules in
    # sys.modules are looked through when the earlier load's are forgotten).
    await client.load(path, sha256, "gen:shapes")
    assert (await client.predict_generated({"shape": [1], "seed": 0}, 0, 1))[0][0][0] == [1]
    await client.close()


def niceness(pid: int) -> list[int]:
    """Each thread's niceness: field 19 of its stat (counted after the command's name, which
    may hold spaces, from the closing parenthesis)."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return [int((t / "stat").read_text().rsplit(")", 1)[1].split()[16]) for t in tasks]


async def test_a_loaded_replica_yields_the_cpu(replica: Replica, tmp_path: Path) -> None:
    path, sha256 = artifact(tmp_path / "gen.py", GENERATED.encode())
    client = await connect(replica)
    pid = replica.process.process.pid
    await client.load(path, sha256, "gen:shapes")
    await client.predict_generated({"shape": [64, 64], "seed": 1}, 0, 4)
    nice = niceness(pid)
    await client.close()
    assert nice and all(n >= LOADED_NICE for n in nice), nice


THREADS = """
import os

import torch


def threads(items):
    return [[torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")] for _ in items]
"""


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({CPUS: "0.5"}, [1, "1"]),
        ({CPUS: "1.5"}, [2, "2"]),
        # The job's own choice wins over the replica's CPUs.
        ({CPUS: "0.5", "OMP_NUM_THREADS": "2"}, [2, "2"]),
    ],
)
async def test_a_replica_s_model_computes_on_as_many_threads_as_it_has_cpus(
    start_learner: StartLearner, tmp_path: Path, variables: dict[str, str], expected: list[Any]
) -> None:
    """As the agent starts a replica: through the launcher, which fits the threads."""
    directory = tmp_path / "serve"
    directory.mkdir(mode=0o700)
    command = (*LAUNCH, PYTHON, "-m", "runners.serve")
    process = start_learner(command, {SERVE_DIR: directory, **variables})
    path, sha256 = artifact(tmp_path / "threads.py", THREADS.encode())
    client = await ReplicaClient.connect(tmp_path, directory, timeout_s=PATIENCE_S)
    await client.load(path, sha256, "threads:threads")
    outputs, _ = await client.predict([0])
    await client.close()
    process.process.send_signal(signal.SIGTERM)

    assert outputs == [expected]
