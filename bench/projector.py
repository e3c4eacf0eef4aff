"""The queue's projections (`jobs`, `tenants`) in a process of their own, as the control plane
(`trainyard serve`) applies them beside the agents, which run elsewhere, and with `pending` its
pending-reasons recorder (in a process of its own, as the control plane runs it) and the
`pending` projection too (which reads every claim's event):
`python -m bench.projector DATABASE_URL [--pending]` runs them until SIGTERM, and
`projector(url)` is such a process for the length of a `with` block."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from controlplane.database import create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.heap import freeze_startup_heap
from controlplane.jobs.projection import JobsProjection
from controlplane.pending.apart import RecorderProcess
from controlplane.pending.projection import PendingProjection
from controlplane.pending.recorder import PendingRecorder
from controlplane.projections.base import Projection
from controlplane.projections.runner import ProjectionRunner
from controlplane.tenants.projection import TenantsProjection

READY = b"ready\n"
START_S = 20.0
STOP_S = 20.0


async def run(url: str, pending: bool) -> None:
    pool = await create_pool(url, min_size=2, max_size=4)
    store = EventStore(pool, EVENT_REGISTRY)
    listener = LogListener(url)
    queue: list[Projection] = [JobsProjection(), TenantsProjection()]
    runner = ProjectionRunner(
        pool, store, listener, [*queue, PendingProjection()] if pending else queue
    )
    # As `trainyard serve` runs it: in a process of its own, its start-up heap frozen.
    recorder = RecorderProcess(url)

    def stop() -> None:
        runner.stop()
        recorder.stop()
        listener.stop()
        listener.wake()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
    try:
        for projection in queue:
            await runner.catch_up(projection)
        if pending:
            # Its first rounds show every queued job and record their reasons a chunk a round:
            # ready once that is done and projected, so that what is timed is the recorder as
            # it runs, round after round. Back to back, not a chunk every RECORDING.
            backlog = PendingRecorder(pool, store, recording=timedelta(0))
            while await backlog.record():
                pass
            await runner.catch_up(runner.projections[PendingProjection.name])
        freeze_startup_heap()  # as the control plane's process does once started
        async with asyncio.TaskGroup() as group:
            group.create_task(listener.run())
            group.create_task(runner.run())
            if pending:
                group.create_task(recorder.run())
                async with asyncio.timeout(START_S):
                    await recorder.up.wait()
            sys.stdout.buffer.write(READY)
            sys.stdout.flush()
    finally:
        await store.close()
        await pool.close()


@asynccontextmanager
async def projector(url: str, *, pending: bool = False) -> AsyncIterator[None]:
    """The projections (and with `pending` the pending-reasons recorder) in a child process,
    caught up with the log when this yields."""
    flags = ["--pending"] if pending else []
    child = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bench.projector", url, *flags), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        async with asyncio.timeout(START_S):
            if await child.stdout.readline() != READY:
                raise RuntimeError(f"the projector exited with {await child.wait()}")
        yield
    finally:
        if child.returncode is None:
            child.send_signal(signal.SIGTERM)
        if await asyncio.wait_for(child.wait(), STOP_S) != 0:
            raise RuntimeError(f"the projector exited with {child.returncode}")


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], "--pending" in sys.argv[2:]))
