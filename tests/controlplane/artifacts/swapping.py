"""A learner's attack on any check of a path: one of its folders and a symbolic link to a folder
outside swapped atomically, over and over (renameat2 RENAME_EXCHANGE), in a process of its own
so that the swaps run while the checker runs."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

SWAPPER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
a, b = (os.fsencode(p) for p in sys.argv[1:3])
print("ready", flush=True)
while True:
    if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
"""


@asynccontextmanager
async def swapping(folder: Path, link: Path) -> AsyncIterator[None]:
    """`folder` and `link` trade places non-stop while the block runs."""
    swapper = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SWAPPER, str(folder), str(link), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert swapper.stdout is not None and await swapper.stdout.readline() == b"ready\n"
        yield
    finally:
        swapper.kill()
        await swapper.wait()
    assert swapper.returncode == -9, "the swapper stopped before it was killed"
