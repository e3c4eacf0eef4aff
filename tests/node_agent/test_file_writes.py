"""Followers of a learner's output files, woken by the writes to the files they hold open."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent import file_writes
from node_agent.file_writes import FileWrites
from tests.polling import eventually

NEVER_S = 600.0
"""The polls' intervals in these tests: a follower that wakes was woken by a write."""


@pytest.fixture(autouse=True)
def _no_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_writes, "WATCHED_POLL_S", NEVER_S)
    monkeypatch.setattr(file_writes, "POLL_S", NEVER_S)


@contextlib.contextmanager
def _opened(path: Path, flags: int = os.O_RDONLY) -> Iterator[int]:
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _append(path: Path, data: bytes) -> None:
    with _opened(path, os.O_WRONLY | os.O_APPEND) as fd:
        os.write(fd, data)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """A learner's output file, empty."""
    output = tmp_path / "stdout.log"
    output.touch()
    return output


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def _fds_are(expected: set[str]) -> bool:
    return _open_fds() == expected


def _never() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


async def _woken(wait: asyncio.Task[None], within_s: float = 10.0) -> bool:
    done, _ = await asyncio.wait({wait}, timeout=within_s)
    return wait in done


async def test_a_write_to_a_followed_file_wakes_its_follower(path: Path) -> None:
    with _opened(path) as held, FileWrites().follow([held]) as follower:
        assert follower.watched
        follower.clear()
        wait = asyncio.ensure_future(follower.wait(_never()))
        assert not await _woken(wait, within_s=0.2)  # nothing written yet
        _append(path, b"a report\n")
        assert await _woken(wait)
        assert os.read(held, 100) == b"a report\n"


async def test_a_write_before_the_wait_but_after_clear_is_not_missed(path: Path) -> None:
    with _opened(path) as held, FileWrites().follow([held]) as follower:
        follower.clear()
        _append(path, b"written while the reader read\n")
        await asyncio.sleep(0.05)  # the event loop reads the kernel's event meanwhile
        assert await _woken(asyncio.ensure_future(follower.wait(_never())))


async def test_the_watch_is_on_the_held_file_not_its_path(path: Path) -> None:
    # A learner that replaces its output file wakes nobody by writing the new one; writes to
    # the file the agent holds still do.
    with (
        _opened(path) as held,
        FileWrites().follow([held]) as follower,
        _opened(path, os.O_WRONLY | os.O_APPEND) as learners,
    ):
        os.rename(path, path.with_name("moved.log"))
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        follower.clear()
        wait = asyncio.ensure_future(follower.wait(_never()))
        _append(path, b"a forged report\n")
        assert not await _woken(wait, within_s=0.2)
        os.write(learners, b"its own output\n")
        assert await _woken(wait)


async def test_an_ended_learner_wakes_its_follower(path: Path) -> None:
    with _opened(path) as held, FileWrites().follow([held]) as follower:
        follower.clear()
        ended = _never()
        wait = asyncio.ensure_future(follower.wait(ended))
        ended.set_result(None)
        assert await _woken(wait)


async def test_followers_of_one_file_are_each_woken_and_leave_nothing_open(
    path: Path,
) -> None:
    before = _open_fds()
    writes = FileWrites()
    with _opened(path) as one, _opened(path) as other, writes.follow([one]) as first:
        with writes.follow([other]) as second:
            first.clear()
            second.clear()
            waits = [asyncio.ensure_future(f.wait(_never())) for f in (first, second)]
            _append(path, b"line\n")
            assert all([await _woken(wait) for wait in waits])
        # The second one's end leaves the first one's watch of the same file.
        first.clear()
        wait = asyncio.ensure_future(first.wait(_never()))
        _append(path, b"more\n")
        assert await _woken(wait)
    # The instance is closed with its last follower (in a thread: see `FileWrites._close`).
    await eventually(lambda: _fds_are(before), seconds=10)


async def test_the_instance_is_closed_even_once_the_loop_s_executor_is_shut_down(
    path: Path,
) -> None:
    before = _open_fds()
    with _opened(path) as held, FileWrites().follow([held]) as follower:
        assert follower.watched
        await asyncio.get_running_loop().shutdown_default_executor()
    assert _open_fds() == before
