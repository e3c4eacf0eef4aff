"""The agent connects to its replica's own socket only: the way down from its work directory is
walked without following symlinks, and `serve.sock` must be a socket of the replica's user. A
replica that puts a symlink to another socket of the node in its place (another tenant's
replica, the engine's) is refused with the reason, in both runtimes, and that other socket
sees no connection."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from node_agent.replica_client import ReplicaClient, ReplicaRefused
from node_agent.runtime import Folder
from runners.serve import SOCKET_NAME
from tests.node_agent import test_runtime_contract as contract

# Both runtimes, as the runtime contract gives them (the process runtime, and Docker's where
# an engine is).
kind = contract.kind
node = contract.node

PATIENCE_S = 60.0

SWAPPING_REPLICA = """
import os, socket, sys, time
os.chdir(sys.argv[1])
listener = socket.socket(socket.AF_UNIX)
listener.bind("serve.sock")
listener.listen()
print("listening", flush=True)
listener.accept()[0].close()
os.unlink("serve.sock")
os.symlink(sys.argv[2], "serve.sock")
print("swapped", flush=True)
time.sleep(600)
"""


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[socket.socket]:
    """A socket of the node's that no replica may reach through the agent."""
    folder = tmp_path / "victim"
    folder.mkdir()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(folder / "other.sock"))
        listener.listen()
        listener.setblocking(False)
        yield listener


def untouched(listener: socket.socket) -> bool:
    try:
        connection, _ = listener.accept()
    except BlockingIOError:
        return True
    connection.close()
    return False


async def test_a_replica_that_swaps_its_socket_for_a_symlink_is_refused(
    node: contract.Node, victim: socket.socket
) -> None:
    work_dir = node.work_dir
    spec = node.spec("")
    serve = spec.workdir / "serve"
    command = [node.python, "-c", SWAPPING_REPLICA, str(serve), victim.getsockname()]
    spec = replace(spec, command=command, folders=[Folder(work_dir, serve)])
    learner = await node.runtime.start(spec)
    try:
        # Its own socket, made as its user, is connected to (it says so once it accepted).
        client = await ReplicaClient.connect(work_dir, serve, timeout_s=PATIENCE_S)
        await client.close()
        assert await contract.first_lines(learner, 2) == ["listening", "swapped"]
        assert (serve / SOCKET_NAME).is_symlink()
        with pytest.raises(ReplicaRefused, match="is a symlink of uid"):
            await ReplicaClient.connect(work_dir, serve, timeout_s=PATIENCE_S)
        assert untouched(victim)
    finally:
        learner.signal(signal.SIGKILL)
        await learner.wait()
        await learner.remove()


def listening_in(folder: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(folder / SOCKET_NAME))
    listener.listen()
    return listener


@pytest.mark.skipif(os.geteuid() != 0, reason="making sockets of other users needs root")
async def test_a_link_to_another_users_socket_is_refused(
    tmp_path: Path, victim: socket.socket
) -> None:
    replica_uid = contract.LEARNER_UID
    serve = tmp_path / "work" / "job" / "serve"
    serve.mkdir(parents=True)
    for folder in (serve.parent, serve):
        os.chown(folder, replica_uid, replica_uid)
    # A hard link keeps the inode's owner: the other socket's (root here).
    os.link(victim.getsockname(), serve / SOCKET_NAME)
    with pytest.raises(ReplicaRefused, match=rf"a socket of uid 0, not .* {replica_uid}"):
        await ReplicaClient.connect(tmp_path / "work", serve, timeout_s=PATIENCE_S)
    assert untouched(victim)
    # Its own socket (its user's) is connected to.
    (serve / SOCKET_NAME).unlink()
    with listening_in(serve) as listener:
        os.chown(serve / SOCKET_NAME, replica_uid, replica_uid)
        client = await ReplicaClient.connect(tmp_path / "work", serve, timeout_s=PATIENCE_S)
        listener.accept()[0].close()
        await client.close()


async def test_a_folder_on_the_way_swapped_for_a_symlink_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "serve").mkdir(parents=True)
    job = tmp_path / "work" / "job"
    job.mkdir(parents=True)
    with listening_in(elsewhere / "serve"):
        # The job's folder is the agent's to make; what the replica can change is below it.
        (job / "attempt-1").symlink_to(elsewhere)
        with pytest.raises(ReplicaRefused, match=r"'attempt-1' on the way to .* not a directory"):
            await ReplicaClient.connect(
                tmp_path / "work", job / "attempt-1" / "serve", timeout_s=PATIENCE_S
            )
