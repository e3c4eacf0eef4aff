"""Short commands the agent runs on its node (`ip`, `iptables`): in a thread, not as asyncio
subprocesses.

CPython 3.11's asyncio subprocess cannot be cancelled at every instant: a task cancelled while
its pipes are being connected waits forever for an exit it is never told of (CPython issue
125502, fixed after 3.11). The agent's shutdown, and a test's end, cancel whatever is running,
and one such wait held a whole test run. A command in a thread is never cut: cancelling its
caller leaves it to finish (these take milliseconds), and nothing waits on what cannot come.
Learners, which run for hours and are watched as they run, stay asyncio subprocesses.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

TIMEOUT_S = 60.0
"""Longer than any of these takes; iptables may wait for the xtables lock Docker holds."""


@dataclass(frozen=True)
class Finished:
    code: int
    out: str
    err: str


async def run(program: str, *args: str, pass_fds: Sequence[int] = ()) -> Finished:
    """`program args`, once it has ended; a command still running after TIMEOUT_S is killed,
    and reported as a failure (exit -9) rather than raised. `pass_fds`: descriptors it gets
    under the same numbers (a folder opened by walking, named `/proc/self/fd/N`)."""
    return await asyncio.to_thread(_run, [program, *args], pass_fds)


def _run(argv: list[str], pass_fds: Sequence[int] = ()) -> Finished:
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT_S,
            check=False,
            pass_fds=pass_fds,
        )
    except subprocess.TimeoutExpired as exc:
        return Finished(-9, "", f"no end after {TIMEOUT_S:g} s: {exc}")
    return Finished(
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )
