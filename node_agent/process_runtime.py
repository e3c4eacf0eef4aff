"""Learners as processes: for development, demos and machines without Docker.

Each learner runs in its own session and process group, with exactly its GPUs visible, its
environment and working directory, and resource limits. The image is not used.

Learners outlive their agent (dependability promise 6): their output goes to files in their
working directory rather than pipes (a pipe would break when the agent dies, and the learner
with it), the agent tails those files, and the launcher writes its exit status to a file as it
ends. A restarted agent finds its node's learners by their environment, which names node, job,
attempt, learner and epoch (as container labels do for Docker), and re-adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Literal
from uuid import UUID

from node_agent.folders import open_regular, prepare
from node_agent.learners import learner_dir
from node_agent.runtime import (
    ATTEMPT,
    EPOCH,
    JOB_ID,
    LEARNER,
    NODE,
    ExitStatus,
    FoundLearner,
    Learner,
    LearnerLine,
    LearnerSpec,
    LearnerStartError,
    Stream,
    learner_env,
)
from node_agent.users import leftover_processes
from runners.config import EXIT_FILE

log = logging.getLogger(__name__)

LINE_LIMIT = 1 << 20
"""Longest line read at once; longer output arrives in pieces (and the log store splits)."""
READ_CHUNK = 1 << 20
POLL_S = 0.02
"""How long a quiet learner's files wait before they are read again: a report (a phase, a
checkpoint) reaches the agent within it."""
OUTPUT_FILES: dict[Stream, str] = {"stdout": "stdout.log", "stderr": "stderr.log"}
EXIT_STATUS_FILE = "exit-status"


def process_env(spec: LearnerSpec) -> dict[str, str]:
    """A learner process's environment, made afresh: nothing of the agent's (its database URL,
    its tokens) but the node's PATH, after the launcher's interpreter's folder: a command that
    names `python` runs in the launcher's environment (which has `runners`, as the learner
    image has), as a manifest written for the learner image expects; and where its launcher
    leaves its exit status. Its TRAINYARD_* variables are also how a restarted agent
    recognises it (see `find_learners`)."""
    node_path = os.environ.get("PATH", "/usr/bin:/bin")
    interpreter = os.path.dirname(spec.command[0])
    path = f"{interpreter}:{node_path}" if os.path.isabs(interpreter) else node_path
    return {**learner_env(spec, path=path), EXIT_FILE: str(spec.workdir / EXIT_STATUS_FILE)}


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
    """A learner process, started by this agent or adopted from an earlier one."""

    def __init__(
        self,
        pid: int | None,
        workdir: Path,
        status: Awaitable[ExitStatus],
        user: tuple[int, int] | None = None,
        node: str | None = None,
    ) -> None:
        self._pid = pid
        self._node = node
        self._workdir = workdir
        self._status = asyncio.ensure_future(status)
        self._user = user

    async def lines(self) -> AsyncIterator[LearnerLine]:
        with contextlib.ExitStack() as stack:
            try:
                files = stack.enter_context(_output_files(self._workdir, "rb"))
            except OSError as exc:
                # The learner replaced them (with a symlink, a FIFO): its output is lost, the
                # agent's files are not read for it, and its end is still awaited.
                log.warning("learner in %s: its output cannot be read: %s", self._workdir, exc)
                return
            tails = [_Tail(stream, file) for stream, file in files.items()]
            while True:
                # Looked at before reading: whatever the learner wrote before it ended is then
                # in the files, and this round reads it all.
                ended = self._status.done()
                quiet = True
                for tail in tails:
                    for line in tail.lines():
                        quiet = False
                        yield LearnerLine(tail.stream, line, datetime.now(UTC))
                if ended:
                    for tail in tails:
                        if (rest := tail.rest()) is not None:
                            yield LearnerLine(tail.stream, rest, datetime.now(UTC))
                    return
                if quiet:
                    await asyncio.wait({self._status}, timeout=POLL_S)

    async def wait(self) -> ExitStatus:
        return await asyncio.shield(self._status)

    async def remove(self) -> None:
        """Kill what the learner left running (a daemon its command detached, still holding
        its GPUs): every process of the job's user, which only the job's learners use. Its
        files stay. Nothing to do for learners that run as the agent's user."""
        if self._user is None:
            return
        for pid in leftover_processes(self._user[0], self._node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def signal(self, sig: signal.Signals) -> None:
        if self._pid is None or self._status.done():
            return  # it has ended: its pid may be another process's by now
        with contextlib.suppress(ProcessLookupError):
            if sig is signal.SIGKILL:
                # Everything in the learner's process group: nothing may outlive the kill.
                os.killpg(self._pid, sig)
            else:
                # The launcher alone: it forwards the signal to the training command (which
                # would otherwise get it twice) and reports what happened.
                os.kill(self._pid, sig)


@contextlib.contextmanager
def _output_files(workdir: Path, mode: Literal["rb", "ab"]) -> Iterator[dict[Stream, BinaryIO]]:
    """The learner's output files, opened by the agent: never through a symlink, and for
    reading only if they are regular files (the learner owns its folder and may have replaced
    them with a link to the agent's secrets, or a FIFO that would block the agent). Local
    files: opening them does not block the event loop for any time that matters."""
    with contextlib.ExitStack() as stack:
        files: dict[Stream, BinaryIO] = {}
        for stream, name in OUTPUT_FILES.items():
            path = workdir / name
            if mode == "rb":
                fd = open_regular(path)
            else:
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(path, flags, 0o600)
            files[stream] = stack.enter_context(os.fdopen(fd, mode))
        yield files


class _Tail:
    """The lines of one output file as it grows; a line longer than LINE_LIMIT comes in pieces
    of exactly that size, so that reading the file again gives the same pieces."""

    def __init__(self, stream: Stream, file: BinaryIO) -> None:
        self.stream = stream
        self._file = file
        self._partial = b""

    def lines(self) -> Iterator[str]:
        while chunk := self._file.read(READ_CHUNK):
            self._partial += chunk
            *complete, self._partial = self._partial.split(b"\n")
            for raw in complete:
                yield from _pieces(raw)
            while len(self._partial) >= LINE_LIMIT:
                piece, self._partial = self._partial[:LINE_LIMIT], self._partial[LINE_LIMIT:]
                yield _text(piece)

    def rest(self) -> str | None:
        """The last line, written without a newline, once the learner has ended."""
        return _text(self._partial) if self._partial else None


def _pieces(raw: bytes) -> Iterator[str]:
    for start in range(0, max(len(raw), 1), LINE_LIMIT):
        yield _text(raw[start : start + LINE_LIMIT])


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


async def _exit_of_child(process: asyncio.subprocess.Process) -> ExitStatus:
    return ExitStatus.from_returncode(await process.wait())


async def _exit_of_adopted(pid: int | None, workdir: Path) -> ExitStatus:
    """How a learner that is not this agent's child ended: it is not ours to wait for, so its
    end is seen through a pidfd and its status read from the file its launcher wrote."""
    if pid is not None:
        await _until_ended(pid)
    try:
        # Written by the launcher, as the job's user: read like its output files.
        with os.fdopen(open_regular(workdir / EXIT_STATUS_FILE), "rb") as status:
            return ExitStatus(code=int(status.read(32)))
    except (OSError, ValueError):
        return ExitStatus(code=None)  # killed before its launcher could say


async def _until_ended(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ended.done():
            ended.set_result(None)

    # A pidfd becomes readable when its process ends.
    loop.add_reader(fd, readable)
    try:
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def find_learners(node: str, work_dir: Path, proc: Path = Path("/proc")) -> list[FoundLearner]:
    """The running learners that an agent of `node` on `work_dir` started: processes whose
    environment names the node and a file under the work directory, which lead their own
    process group (the training commands they run share their environment, but not their
    group), and which run as the user that owns the job's folder. Another agent of the same
    name on this machine (another cluster's, named after the host too, or another test run's)
    has another work directory, and its learners are not this agent's to adopt or kill; a
    process one job's code started with another job's variables is an impostor, run by the
    wrong user, and is not adopted as that job's learner."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = dict(
                item.split("=", 1)
                for item in (entry / "environ").read_bytes().decode("utf-8", "replace").split("\0")
                if "=" in item
            )
            pid = int(entry.name)
            if environ.get(NODE) != node or os.getpgid(pid) != pid:
                continue
            job_id, attempt, learner = (
                UUID(environ[JOB_ID]),
                int(environ[ATTEMPT]),
                int(environ[LEARNER]),
            )
            # Trainyard's own variable (the manifest's env cannot override it): the exit file
            # in the working directory of the learner it claims to be, whose owner it runs as.
            workdir = learner_dir(work_dir, job_id, attempt, learner)
            if environ[EXIT_FILE] != str(workdir / EXIT_STATUS_FILE):
                continue
            if entry.stat().st_uid != workdir.stat().st_uid:
                continue
            found.append(
                FoundLearner(
                    job_id=job_id,
                    attempt=attempt,
                    learner=learner,
                    epoch=int(environ[EPOCH]),
                    handle=str(pid),
                )
            )
        except (OSError, KeyError, ValueError):
            continue  # it ended meanwhile, is not ours to read, or is no learner
    return found


class ProcessRuntime:
    name = "process"

    def __init__(self, work_dir: Path) -> None:
        self._work_dir = work_dir
        """The agent's: every learner it starts works below it."""

    async def start(self, spec: LearnerSpec) -> Learner:
        if spec.user is None and os.geteuid() == 0:
            raise LearnerStartError("no user to run it as: tenants' code never runs as root")
        # Its folders made and its locations checked, on the node, now.
        # In a thread: it walks the tenant's folders, which the tenant may have filled.
        spec = await asyncio.to_thread(prepare, spec)
        user, group = spec.user if spec.user is not None else (None, None)
        try:
            with _output_files(spec.workdir, "ab") as files:
                process = await self._spawn(spec, files, user, group)
        except OSError as exc:
            raise LearnerStartError(f"cannot open its output files: {exc}") from exc
        return ProcessLearner(
            process.pid, spec.workdir, _exit_of_child(process), spec.user, spec.node
        )

    @staticmethod
    async def _spawn(
        spec: LearnerSpec, files: dict[Stream, BinaryIO], user: int | None, group: int | None
    ) -> asyncio.subprocess.Process:
        try:
            return await asyncio.create_subprocess_exec(
                *spec.command,
                cwd=spec.workdir,
                env=process_env(spec),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=files["stdout"],
                stderr=files["stderr"],
                # Its own session and process group: signals from the agent's terminal do
                # not reach it, it outlives the agent, and the agent signals the group.
                start_new_session=True,
                preexec_fn=_limits(spec.memory_mb),
                # The job's user, with no supplementary groups (the agent's, root's, would
                # stay otherwise): set in the child before it runs anything of the job's.
                user=user,
                group=group,
                extra_groups=[] if user is not None else None,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            # Not an OSError any more: the caller reports it as the start's failure.
            raise LearnerStartError(f"cannot start {spec.command[0]!r}: {exc}") from exc

    async def find(self, node: str) -> list[FoundLearner]:
        return find_learners(node, self._work_dir)

    async def adopt(self, spec: LearnerSpec, found: FoundLearner | None) -> Learner | None:
        if found is None and not (spec.workdir / OUTPUT_FILES["stdout"]).exists():
            return None  # its output files are made before it starts: it never started
        pid = int(found.handle) if found is not None else None
        return ProcessLearner(
            pid, spec.workdir, _exit_of_adopted(pid, spec.workdir), spec.user, spec.node
        )

    async def kill(self, found: FoundLearner) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(found.handle), signal.SIGKILL)
