"""A node's agent identity, kept in its work directory, and the lock that lets one agent at a
time use that directory.

The identity survives restarts, so an agent that restarts after a crash takes its node's lease
back at once (it is the holder) instead of waiting out the lease it left behind; a second agent
started on the same directory while the first runs is refused by the lock, which the kernel
releases when its holder dies, however it dies.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from controlplane.agent_port.vocabulary import CommandFailed

IDENTITY_FILE = "agent-id"
LOCK_FILE = "agent.lock"


class WorkDirInUse(CommandFailed):
    """Another agent runs on this work directory."""


@contextmanager
def agent_identity(work_dir: Path) -> Iterator[uuid.UUID]:
    """Hold the work directory's lock while in the block; the agent id kept there (made on
    first use)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(work_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkDirInUse(
                f"another agent is running on work directory {work_dir}; stop it, or give "
                "this one its own --work-dir"
            ) from None
        yield _identity(work_dir / IDENTITY_FILE)
    finally:
        os.close(fd)  # releases the lock


def _identity(path: Path) -> uuid.UUID:
    try:
        return uuid.UUID(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        identity = uuid.uuid4()
        # Whole or not at all: a crash mid-write must not leave an id that cannot be read.
        partial = path.with_name(path.name + ".partial")
        partial.write_text(f"{identity}\n")
        partial.replace(path)
        return identity
