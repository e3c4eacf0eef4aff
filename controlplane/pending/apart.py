"""The pending-reasons recorder in a process of its own, as `trainyard serve` runs it.

A round judges the whole queue in Python: tens of milliseconds of CPU with thousands of jobs
queued, every quarter of a second. In the API's process, even in a thread, that work shared the
interpreter's lock with the event loop, which then waited for the lock at each of a request's
steps: `bench api` submitted at 200/s with a p99 of 31 to 44 ms with the recorder beside it
and 8 to 15 ms without it (after the first second, three runs of each, 2026-12-01). A process
of its own runs the same `PendingRecorder`, on a core of its own where there is one.

`RecorderProcess` is the API's side: a worker (`run` until `stop`) that starts the process and
starts it again should it end; `python -m controlplane.pending.apart` is the process, which
records until SIGTERM, or until its standard input ends: the control plane that
started it is gone, killed or not, and it goes too, never a recorder without its replica."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from controlplane.database import create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.store import EventStore
from controlplane.heap import freeze_startup_heap
from controlplane.pending.recorder import PendingRecorder
from controlplane.settings import DATABASE_URL_ENV
from controlplane.workers import pause

log = logging.getLogger(__name__)

MODULE = "controlplane.pending.apart"
READY = b"ready"
"""What the process writes to its standard output once it has its connections and has frozen its
start-up heap: this word, a space, how many objects it froze (`heap.freeze_startup_heap`), and
a newline."""
STOP_S = 5.0
"""How long the process gets to end its round and close its connections once asked to stop."""
RESTART_S = (1.0, 30.0)
"""The first and the longest pause before a process that ended is started again, doubling."""
POOL_SIZE = 2
"""A round uses one connection at a time; the other is spare."""
RAN_LONG_S = 60.0
"""A process that ran this long before it ended is started again after the first pause."""


class RecorderProcess:
    """Keeps `python -m controlplane.pending.apart` running on the database at `url`."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stopping = asyncio.Event()
        self._process: asyncio.subprocess.Process | None = None
        self.up = asyncio.Event()
        """Set while a process is up: started, its connections opened."""
        self.frozen: int | None = None
        """How many objects the last process that came up took out of its garbage collector's
        walk once started (see `heap.freeze_startup_heap`)."""

    async def run(self) -> None:
        """Run the process until `stop()`, starting it again whenever it ends before."""
        wait_s = RESTART_S[0]
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            started = loop.time()
            how = await self._run_once()
            if self._stopping.is_set():
                break
            if loop.time() - started >= RAN_LONG_S:
                wait_s = RESTART_S[0]
            log.warning(
                "the pending-reasons recorder's process %s; starting it again in %g s", how, wait_s
            )
            await pause(self._stopping, wait_s)
            wait_s = min(2 * wait_s, RESTART_S[1])

    @property
    def pid(self) -> int | None:
        """The process's, while one runs."""
        return None if self._process is None else self._process.pid

    def stop(self) -> None:
        self._stopping.set()
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()

    async def _run_once(self) -> str:
        """Start the process and wait for its end; how it ended."""
        try:
            process = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", MODULE, str(logging.getLogger().getEffectiveLevel())),
                env={**os.environ, DATABASE_URL_ENV: self._url},
                # Its end is the process's signal that this one is gone (see `parent_gone`).
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
        except OSError as exc:  # out of processes or memory for a moment
            return f"could not start ({exc})"
        self._process = process
        try:
            if self._stopping.is_set():
                process.terminate()  # asked to stop while it started
            if process.stdout is not None:
                word, _, frozen = (await process.stdout.readline()).partition(b" ")
                if word == READY and frozen.strip().isdigit():
                    self.frozen = int(frozen)
                    self.up.set()
            return f"ended (status {await process.wait()})"
        finally:
            self.up.clear()
            # Cancelled (the control plane's stop ran out of time): it ends with this task, a
            # SIGKILL if it does not end on its own in time, never an orphan.
            if process.returncode is None:
                await asyncio.shield(_ended(process))
            self._process = None


async def _ended(process: asyncio.subprocess.Process) -> None:
    process.terminate()
    try:
        async with asyncio.timeout(STOP_S):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()


async def main(level: int) -> int:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pool = await create_pool(os.environ[DATABASE_URL_ENV], min_size=1, max_size=POOL_SIZE)
    store = EventStore(pool, EVENT_REGISTRY)
    recorder = PendingRecorder(pool, store)
    # Started: what lives as long as the process is out of every collection's walk, which
    # otherwise made a round now and then cost a core for 50 ms more.
    sys.stdout.buffer.write(b"%s %d\n" % (READY, freeze_startup_heap()))
    sys.stdout.flush()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, recorder.stop)
    # A terminal's Ctrl-C reaches the whole process group: the control plane stops this
    # process itself as it shuts down, which it would otherwise report as a process that died.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        async with asyncio.TaskGroup() as group:
            watch = group.create_task(parent_gone(), name="parent-gone")
            watch.add_done_callback(lambda _: recorder.stop())
            await recorder.run()
            watch.cancel()
    finally:
        await store.close()
        await pool.close()
    return 0


async def parent_gone() -> None:
    """Return once standard input ends: the process that started this one, which holds the
    other end of the pipe, closed it or died."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.read(1 << 12):
        pass


if __name__ == "__main__":
    sys.exit(asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else logging.WARNING)))
