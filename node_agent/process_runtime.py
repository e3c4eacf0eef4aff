"""Learners as child processes: for development, demos and machines without Docker.

Each learner runs in its own session and process group, with exactly its GPUs visible, its
environment and working directory, and resource limits. The image is not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

from node_agent.runtime import (
    ExitStatus,
    Learner,
    LearnerLine,
    LearnerSpec,
    LearnerStartError,
    Stream,
    learner_env,
)

LINE_LIMIT = 1 << 20
"""Longest line read at once; longer output arrives in pieces (and the log store splits)."""


def _limits(memory_mb: int) -> Callable[[], None]:
    def apply() -> None:
        # Runs in the child between fork and exec. RLIMIT_DATA bounds heap and private
        # mappings (so an allocation beyond the manifest's memory fails in the learner instead
        # of pushing the node into swap or the OOM killer); no core dumps of training state.
        data = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_DATA, (data, data))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


class ProcessLearner:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    async def lines(self) -> AsyncIterator[LearnerLine]:
        queue: asyncio.Queue[LearnerLine | None] = asyncio.Queue(maxsize=1024)
        assert self._process.stdout is not None and self._process.stderr is not None
        readers = [
            asyncio.create_task(_pump("stdout", self._process.stdout, queue)),
            asyncio.create_task(_pump("stderr", self._process.stderr, queue)),
        ]
        try:
            ended = 0
            while ended < len(readers):
                item = await queue.get()
                if item is None:
                    ended += 1
                else:
                    yield item
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    async def wait(self) -> ExitStatus:
        return ExitStatus.from_returncode(await self._process.wait())

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if sig is signal.SIGKILL:
                # Everything in the learner's process group: nothing may outlive the kill.
                os.killpg(self._process.pid, sig)
            else:
                # The launcher alone: it forwards the signal to the training command (which
                # would otherwise get it twice) and reports what happened.
                os.kill(self._process.pid, sig)

    async def remove(self) -> None:
        """Nothing to remove: the ended process is reaped, its files are the node's."""


async def _pump(
    stream: Stream, reader: asyncio.StreamReader, queue: asyncio.Queue[LearnerLine | None]
) -> None:
    while True:
        try:
            raw = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            raw = exc.partial  # the last line without a newline, or b"" at the end
        except asyncio.LimitOverrunError as exc:
            raw = await reader.readexactly(exc.consumed)  # a piece of a very long line
        if not raw:
            break
        text = raw.decode("utf-8", "replace").rstrip("\n")
        await queue.put(LearnerLine(stream, text, datetime.now(UTC)))
    await queue.put(None)  # this stream has ended


class ProcessRuntime:
    name = "process"

    async def start(self, spec: LearnerSpec) -> Learner:
        spec.workdir.mkdir(parents=True, exist_ok=True)
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.command,
                cwd=spec.workdir,
                env=learner_env(spec, path=os.environ.get("PATH", "/usr/bin:/bin")),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                # Its own session and process group: signals from the agent's terminal do not
                # reach it, and the agent signals the whole group.
                start_new_session=True,
                preexec_fn=_limits(spec.memory_mb),
                limit=LINE_LIMIT,
            )
        except OSError as exc:
            raise LearnerStartError(f"cannot start {spec.command[0]!r}: {exc.strerror}") from exc
        return ProcessLearner(process)
