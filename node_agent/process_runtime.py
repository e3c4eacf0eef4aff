"""Learners as processes: for development, demos and machines without Docker.

Under an agent that is root (the only kind that gives jobs users of their own), each learner runs
in the sandbox (`node_agent.sandbox`: bubblewrap, a cgroup with the manifest's limits, its job's
user without capabilities, only its GPUs' device nodes), or not at all. Under an agent that is
not root, learners run as the agent's user, in a session of their own, with exactly their GPUs
visible and a bound on their data (that agent can give them neither users nor cgroups, and says
so as it starts). The image is not used.

Learners outlive their agent (dependability promise 6): their output goes to files in their
working directory rather than pipes (a pipe would break when the agent dies, and the learner
with it), the agent tails those files (woken by their writes: `node_agent.file_writes`), and
the launcher writes its exit status to a file as it ends. A restarted agent finds its node's
learners by their environment, which names node, job, attempt, learner and epoch (as container
labels do for Docker), and re-adopts them.

Those files lie in the learner's own folder, which it may change as it likes: the agent opens
them by walking folder descriptors from its work directory (which it owns), following no
symlink, and reads them only when they are regular files of their writer's alone (its own for
the output files, which it made; the job's user's for the exit status, which the launcher
writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Literal
from uuid import UUID

from node_agent.cgroups import Cgroup, CgroupError, Limits
from node_agent.containers import PIDS_LIMIT
from node_agent.file_writes import FileWrites
from node_agent.folders import prepare
from node_agent.job_netns import Hold, JobNamespaces
from node_agent.learners import learner_dir
from node_agent.runtime import (
    ATTEMPT,
    EPOCH,
    JOB_ID,
    LEARNER,
    NODE,
    CpuShare,
    ExitStatus,
    FoundLearner,
    Learner,
    LearnerLine,
    LearnerSpec,
    LearnerStartError,
    Stream,
    learner_env,
)
from node_agent.sandbox import (
    CLEAR_S,
    READY_WORD,
    Sandbox,
    SandboxMissing,
    cgroup_name,
    child_of,
    clear,
    exit_status,
    read_all,
)
from node_agent.warm import WarmSandbox, WarmSandboxes, WarmSettings
from runners.config import EXIT_FILE

log = logging.getLogger(__name__)

LINE_LIMIT = 1 << 20
"""Longest line read at once; longer output arrives in pieces (and the log store splits)."""
READ_CHUNK = 1 << 20
POLL_S = 0.02
"""How often the agent looks whether a sandbox it waits for has ended."""
OUTPUT_FILES: dict[Stream, str] = {"stdout": "stdout.log", "stderr": "stderr.log"}
EXIT_STATUS_FILE = "exit-status"
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
        # Runs in the child between fork and exec, for a learner of an agent that is not root
        # (which has no cgroups to give). RLIMIT_DATA bounds heap and private mappings (so an
        # allocation beyond the manifest's memory fails in the learner instead of pushing the
        # node into swap or the OOM killer); no core dumps of training state.
        data = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_DATA, (data, data))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


class LearnerFiles:
    """A learner's output and exit-status files, in its working directory (its own), opened by
    the agent without following anything the learner planted: each folder from the agent's
    work directory on with O_NOFOLLOW, the file too, and then checked by fstat to be a regular
    file of its writer's alone (a learner may have replaced it with a link to the agent's
    secrets, a FIFO that would block the agent, or a file of its own)."""

    def __init__(self, work_dir: Path, spec: LearnerSpec) -> None:
        self.workdir = spec.workdir
        self._work_dir = work_dir
        self._agent = os.geteuid()
        self._launcher = spec.user[0] if spec.user is not None else self._agent
        """Who writes the exit status: the launcher, as the job's user."""

    def open(self, name: str, flags: int, owner: int) -> int:
        """A descriptor of the file `name` of the learner's working directory (OSError when a
        folder on the way or the file is not what the agent made or expects)."""
        fd = os.open(self._work_dir, _DIRECTORY)
        try:
            for folder in self.workdir.relative_to(self._work_dir).parts:
                child = os.open(folder, _DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = child
            # Non-blocking: opening a FIFO never waits for a writer or a reader.
            flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            file = os.open(name, flags, 0o600, dir_fd=fd)
        finally:
            os.close(fd)
        info = os.fstat(file)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != owner or info.st_nlink != 1:
            os.close(file)
            raise OSError(errno.EPERM, f"{self.workdir / name} is not a file of uid {owner}'s")
        # Blocking again: the learner writes to what the agent opens for it.
        fcntl.fcntl(file, fcntl.F_SETFL, fcntl.fcntl(file, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return file

    @contextlib.contextmanager
    def output(self, mode: Literal["rb", "ab"]) -> Iterator[dict[Stream, BinaryIO]]:
        """Its output files: made by the agent (to append) before it starts, read later.
        Local files: opening them does not block the event loop for any time that matters."""
        flags = os.O_RDONLY if mode == "rb" else os.O_WRONLY | os.O_APPEND | os.O_CREAT
        with contextlib.ExitStack() as stack:
            files: dict[Stream, BinaryIO] = {}
            for stream, name in OUTPUT_FILES.items():
                fd = self.open(name, flags, self._agent)
                files[stream] = stack.enter_context(os.fdopen(fd, mode))
            yield files

    def started(self) -> bool:
        """Whether it was started: its output files are made before it starts."""
        try:
            os.close(self.open(OUTPUT_FILES["stdout"], os.O_RDONLY, self._agent))
        except FileNotFoundError:
            return False
        except OSError:
            pass  # it replaced the file: it ran
        return True

    def exit_code(self) -> int | None:
        """What the launcher left as its exit status; None when it left none that can be read
        (killed before it could say)."""
        try:
            with os.fdopen(self.open(EXIT_STATUS_FILE, os.O_RDONLY, self._launcher), "rb") as file:
                return int(file.read(32))
        except (OSError, ValueError):
            return None

    def last_error(self) -> str:
        """The end of its standard error, where sh and bwrap say why they failed."""
        try:
            with os.fdopen(self.open(OUTPUT_FILES["stderr"], os.O_RDONLY, self._agent), "rb") as f:
                text = f.read()[-1000:].decode("utf-8", "replace").strip()
        except OSError:
            return "(its standard error cannot be read)"
        return text.splitlines()[-1] if text else "(nothing on its standard error)"


class ProcessLearner:
    """A learner process, started by this agent or adopted from an earlier one. `pid`: the
    learner's (its command's); `cgroup`: its sandbox's cgroup, None under an agent that is not
    root; `cpus`: the CPUs its group's quota gives it (None where it has no group)."""

    def __init__(
        self,
        pid: int | None,
        files: LearnerFiles,
        status: Awaitable[ExitStatus],
        cgroup: Cgroup | None = None,
        netns: Hold | None = None,
        *,
        writes: FileWrites,
        leftovers: Callable[[], Awaitable[None]] | None = None,
        init: int | None = None,
        cpus: float | None = None,
    ) -> None:
        self._pid = pid
        self._files = files
        self._writes = writes
        self._status = asyncio.ensure_future(_giving_back(status, netns))
        self._cgroup = cgroup
        self._netns = netns
        """Its hold on its job's network namespace (the job's last learner here takes it)."""
        self._leftovers = leftovers
        """What else its removal takes: the warm sandbox it started in."""
        self._init = init
        """A pidfd of its sandbox's init (`_init_of`), where this agent started it."""
        self._cpus = cpus

    async def lines(self) -> AsyncIterator[LearnerLine]:
        with contextlib.ExitStack() as stack:
            try:
                files = stack.enter_context(self._files.output("rb"))
            except OSError as exc:
                # The learner replaced them (with a symlink, a FIFO): its output is lost, the
                # agent's files are not read for it, and its end is still awaited.
                log.warning(
                    "learner in %s: its output cannot be read: %s", self._files.workdir, exc
                )
                return
            tails = [_Tail(stream, file) for stream, file in files.items()]
            follower = stack.enter_context(
                self._writes.follow([file.fileno() for file in files.values()])
            )
            while True:
                follower.clear()
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
                    await follower.wait(self._status)

    async def wait(self) -> ExitStatus:
        return await asyncio.shield(self._status)

    async def remove(self) -> None:
        """Remove its cgroup, killing what is left in it first (nothing of the learner
        outlives its pid namespace, whose end kills the rest; the group is emptied anyway).
        Its files stay; its job's network namespace goes with the job's last learner here.
        Nothing to do for learners of an agent that is not root."""
        if self._init is not None:
            if self._status.done():
                # bwrap ends once its init has told it how the command ended; the init, still
                # in the group, then tears the sandbox's namespaces down, and the group cannot
                # be removed before it has ended (`clear` would try again after CLEAR_POLL_S).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLEAR_S):
                        await _readable(self._init)
            os.close(self._init)
            self._init = None
        if self._cgroup is not None:
            await clear(self._cgroup)
        if self._netns is not None:
            await self._netns.release()
        if self._leftovers is not None:
            await self._leftovers()

    async def share_cpu(self, share: CpuShare) -> None:
        """Its group's quota and weight; nothing under an agent that is not root, whose
        replicas order their own threads by niceness (`runners.serve._yield_cpu`)."""
        if self._cgroup is None or self._status.done():
            return
        try:
            self._cgroup.share_cpu(*share.limits(self._cpus))
        except CgroupError as exc:
            # Only the order in which busy CPUs are shared suffers, never the replica.
            log.warning("learner in %s: %s", self._files.workdir, exc)

    def signal(self, sig: signal.Signals) -> None:
        if self._pid is None or self._status.done():
            return  # it has ended: its pid may be another process's by now
        with contextlib.suppress(ProcessLookupError):
            if sig is signal.SIGKILL and self._cgroup is None:
                # Everything in the learner's process group: nothing may outlive the kill.
                os.killpg(self._pid, sig)
            else:
                # The launcher alone: it forwards the signal to the training command (which
                # would otherwise get it twice) and reports what happened. In the sandbox, its
                # end ends its pid namespace, with everything in it.
                os.kill(self._pid, sig)


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


async def _giving_back(status: Awaitable[ExitStatus], netns: Hold | None) -> ExitStatus:
    """`status`, once the learner has ended and given back its hold on its job's namespace:
    the job's last learner to end takes it. Not when the agent stops first (the learner runs
    on in it, for the next agent to adopt)."""
    ended = await status
    if netns is not None:
        await netns.release()
    return ended


async def _exit_of_child(process: asyncio.subprocess.Process) -> ExitStatus:
    return ExitStatus.from_returncode(await process.wait())


async def _exit_of_sandbox(
    process: asyncio.subprocess.Process, cgroup: Cgroup, init: int, command: int | None
) -> ExitStatus:
    """How the sandbox's `command` ended. bwrap ends with its exit code once its `init` has no
    process left to reap: what the command left running (a daemon it detached) ends with it,
    as in a container, rather than holding its end back."""
    if command is not None:
        await _until_ended(command)
    ended = asyncio.ensure_future(process.wait())
    try:
        while not ended.done():
            for pid in cgroup.pids() - {process.pid, init}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.wait({ended}, timeout=POLL_S)
    finally:
        ended.cancel()
    return exit_status(ended.result(), oom_killed=cgroup.oom_killed())


async def _exit_of_adopted(
    pid: int | None, files: LearnerFiles, cgroup: Cgroup | None
) -> ExitStatus:
    """How a learner that is not this agent's child ended: it is not ours to wait for, so its
    end is seen through a pidfd and its status read from the file its launcher wrote."""
    if pid is not None:
        await _until_ended(pid)
    oom = cgroup is not None and cgroup.oom_killed()
    code = await asyncio.to_thread(files.exit_code)
    if code is None:
        # Killed before its launcher could say.
        return ExitStatus(code=None, signal="SIGKILL" if oom else None, oom_killed=oom)
    return ExitStatus(code=code, oom_killed=oom)


def _init_of(process: asyncio.subprocess.Process, init: int) -> int | None:
    """A pidfd of the sandbox's `init` (bwrap's child), while its bwrap runs: its pid is not
    another process's then. None when it has ended."""
    try:
        fd = os.pidfd_open(init)
    except ProcessLookupError:
        return None
    if process.returncode is not None:
        os.close(fd)
        return None
    return fd


async def _until_ended(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await _readable(fd)
    finally:
        os.close(fd)


async def _readable(fd: int) -> None:
    """Once the pidfd `fd` is readable: its process has ended."""
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

    def __init__(
        self, work_dir: Path, sandbox: Sandbox | None = None, warm: WarmSettings | None = None
    ) -> None:
        self._work_dir = work_dir
        """The agent's: every learner it starts works below it."""
        self._writes = FileWrites()
        # An agent that is root runs tenants' code in the sandbox or not at all (SandboxMissing
        # names what the node lacks); one that is not root has none to give (see the module).
        if sandbox is None and os.geteuid() == 0:
            sandbox = Sandbox.open()
        self._sandbox = sandbox
        self._namespaces: JobNamespaces | None = None
        """The jobs' network namespaces (sandboxed learners only: the others share the
        node's network, as their agent's user)."""
        if sandbox is not None:
            namespaces = JobNamespaces.open(work_dir)
            if isinstance(namespaces, str):
                raise SandboxMissing(f"{namespaces} (a job's learners share a network of its own)")
            self._namespaces = namespaces
        self.warm: WarmSandboxes | None = None
        """Sandboxes made ahead (sandboxed learners only); swept of an earlier agent's even
        when this one makes none."""
        if sandbox is not None:
            settings = warm or WarmSettings(sys.executable, (), (work_dir,))
            self.warm = WarmSandboxes(sandbox, work_dir, settings)

    async def start(self, spec: LearnerSpec) -> Learner:
        if spec.user is None and os.geteuid() == 0:
            raise LearnerStartError("no user to run it as: tenants' code never runs as root")
        if spec.warm is not None:
            return await self._start_warm(spec, spec.warm)
        # Its folders made and its locations checked, on the node, now.
        # In a thread: it walks the tenant's folders, which the tenant may have filled.
        spec = await asyncio.to_thread(prepare, spec)
        files = LearnerFiles(self._work_dir, spec)
        with contextlib.ExitStack() as stack:
            try:
                output = stack.enter_context(files.output("ab"))
            except (OSError, ValueError) as exc:
                # ValueError: a working directory outside the agent's.
                raise LearnerStartError(f"cannot open its output files: {exc}") from exc
            if self._sandbox is not None:
                return await self._start_sandboxed(self._sandbox, spec, files, output)
            process = await self._spawn(spec, output)
        return ProcessLearner(process.pid, files, _exit_of_child(process), writes=self._writes)

    async def _start_sandboxed(
        self,
        sandbox: Sandbox,
        spec: LearnerSpec,
        files: LearnerFiles,
        output: dict[Stream, BinaryIO],
    ) -> Learner:
        env = process_env(spec)
        # Looked for here, as the engine does for a container: a missing program fails the
        # start itself, not the learner once it runs. The sandbox sees the node's programs.
        if shutil.which(spec.command[0], path=env["PATH"]) is None:
            raise LearnerStartError(f"cannot start {spec.command[0]!r}: no such program")
        limits = Limits(cpus=spec.cpus, memory_mb=spec.memory_mb, pids=PIDS_LIMIT)
        name = cgroup_name(spec.job_id, spec.attempt, spec.learner, spec.epoch)
        netns = None
        if self._namespaces is not None and not spec.network:
            netns = await self._namespaces.acquire(spec.job_id, spec.link)
        try:
            cgroup = sandbox.cgroups.create(name, limits)
        except CgroupError as exc:
            if netns is not None:
                await netns.release()
            raise LearnerStartError(str(exc)) from exc
        try:
            info, write = os.pipe()
            ready, ready_write = os.pipe()
            try:
                process = await asyncio.create_subprocess_exec(
                    *sandbox.argv(spec, cgroup, write, None if netns is None else netns.path),
                    cwd="/",
                    env=env,
                    stdin=ready_write,
                    stdout=output["stdout"],
                    stderr=output["stderr"],
                    # Its own session and process group: signals from the agent's terminal do
                    # not reach it, and it outlives the agent.
                    start_new_session=True,
                    pass_fds=(write,),
                )
            except OSError as exc:
                os.close(info)
                os.close(ready)
                raise LearnerStartError(f"cannot start its sandbox: {exc}") from exc
            finally:
                os.close(write)
                os.close(ready_write)
            # bwrap's report once it has made the learner's process, then the learner's word
            # that its sandbox is made (EOF instead where bwrap could not make them).
            report = await asyncio.to_thread(read_all, info)
            made = await asyncio.to_thread(read_all, ready, len(READY_WORD))
            if not report or made != READY_WORD:
                code = await process.wait()
                error = await asyncio.to_thread(files.last_error)
                raise LearnerStartError(f"its sandbox did not start (exit {code}): {error}")
        except BaseException:
            # Whatever joined the group is killed; what has not joined yet cannot any more
            # (the group is gone), and runs nothing.
            await clear(cgroup)
            if netns is not None:
                await netns.release()
            raise
        init = int(json.loads(report)["child-pid"])
        pid = child_of(init)
        ended = _exit_of_sandbox(process, cgroup, init, pid)
        return ProcessLearner(
            pid,
            files,
            ended,
            cgroup,
            netns,
            writes=self._writes,
            init=_init_of(process, init),
            cpus=spec.cpus,
        )

    async def _start_warm(self, spec: LearnerSpec, name: str) -> Learner:
        """`spec` started in the warm sandbox `name`, which its claim took (`node_agent.warm`)."""
        sandboxes = self.warm
        warm = None if sandboxes is None else sandboxes.start(name)
        if sandboxes is None or warm is None:
            raise LearnerStartError(f"its warm sandbox {name} is not this agent's")
        try:
            return await self._start_in(sandboxes, warm, spec)
        finally:
            # Only now does the pool make the next one (`WarmPool.run`).
            sandboxes.started(name)

    async def _start_in(
        self, sandboxes: WarmSandboxes, warm: WarmSandbox, spec: LearnerSpec
    ) -> Learner:
        try:
            if spec.user != (warm.uid, warm.uid):
                raise LearnerStartError(f"its warm sandbox {warm.name} runs as another uid")
            # In a thread: it walks the tenant's folders, as for a learner started cold.
            spec = await asyncio.to_thread(prepare, spec)
            env = process_env(spec)
            if shutil.which(spec.command[0], path=env["PATH"]) is None:
                raise LearnerStartError(f"cannot start {spec.command[0]!r}: no such program")
        except LearnerStartError:
            await sandboxes.discard(warm)
            raise
        try:
            cgroup = await sandboxes.assign(warm, spec, env)
        except LearnerStartError as exc:
            # The sandbox is gone (ended while idle, say): the learner is not to pay for it.
            log.warning("job %s learner %d: %s; starting it cold", spec.job_id, spec.learner, exc)
            return await self.start(replace(spec, warm=None))
        files = LearnerFiles(self._work_dir, spec)
        ended = _exit_of_sandbox(warm.process, cgroup, warm.init, warm.pid)
        leftovers = functools.partial(sandboxes.release, warm.name)
        init = _init_of(warm.process, warm.init)
        return ProcessLearner(
            warm.pid,
            files,
            ended,
            cgroup,
            writes=self._writes,
            leftovers=leftovers,
            init=init,
            cpus=spec.cpus,
        )

    @staticmethod
    async def _spawn(
        spec: LearnerSpec, output: dict[Stream, BinaryIO]
    ) -> asyncio.subprocess.Process:
        """A learner of an agent that is not root: as the agent's user, without a sandbox."""
        try:
            return await asyncio.create_subprocess_exec(
                *spec.command,
                cwd=spec.workdir,
                env=process_env(spec),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output["stdout"],
                stderr=output["stderr"],
                # Its own session and process group: signals from the agent's terminal do
                # not reach it, it outlives the agent, and the agent signals the group.
                start_new_session=True,
                preexec_fn=_limits(spec.memory_mb),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            # Not an OSError any more: the caller reports it as the start's failure.
            raise LearnerStartError(f"cannot start {spec.command[0]!r}: {exc}") from exc

    async def find(self, node: str) -> list[FoundLearner]:
        """This node's running learners; first, the network namespaces an earlier agent left
        of jobs that have none running here any more."""
        found = find_learners(node, self._work_dir)
        if self.warm is not None:
            started = self.warm.found()
            await self.warm.sweep(set(started))
            found += [
                FoundLearner(r.job_id, r.attempt, r.learner, r.epoch, handle=str(r.pid))
                for r in started.values()
            ]
        if self._namespaces is not None:
            await self._namespaces.sweep({learner.job_id for learner in found})
        return found

    async def adopt(self, spec: LearnerSpec, found: FoundLearner | None) -> Learner | None:
        files = LearnerFiles(self._work_dir, spec)
        if found is None and not files.started():
            return None  # its output files are made before it starts: it never started
        pid = int(found.handle) if found is not None else None
        cgroup = self._cgroup(spec.job_id, spec.attempt, spec.learner, spec.epoch)
        netns = None
        if self._namespaces is not None and not spec.network:
            netns = self._namespaces.adopt(spec.job_id, spec.link)
        ended = _exit_of_adopted(pid, files, cgroup)
        return ProcessLearner(
            pid,
            files,
            ended,
            cgroup,
            netns,
            writes=self._writes,
            leftovers=self._leftovers(spec),
            cpus=spec.cpus,
        )

    async def kill(self, found: FoundLearner) -> None:
        cgroup = self._cgroup(found.job_id, found.attempt, found.learner, found.epoch)
        with contextlib.suppress(ProcessLookupError):
            if cgroup is None:
                os.killpg(int(found.handle), signal.SIGKILL)
            else:
                os.kill(int(found.handle), signal.SIGKILL)  # its namespace ends with it
        if cgroup is not None:
            await clear(cgroup)
        if self._namespaces is not None:
            await self._namespaces.discard(found.job_id)
        if (leftovers := self._leftovers(found)) is not None:
            await leftovers()

    def _leftovers(
        self, learner: LearnerSpec | FoundLearner
    ) -> Callable[[], Awaitable[None]] | None:
        """What the warm sandbox the learner started in leaves, to remove with it (None: it
        started cold)."""
        if self.warm is None:
            return None
        key = (learner.job_id, learner.attempt, learner.learner, learner.epoch)
        name = self.warm.of(*key)
        return None if name is None else functools.partial(self.warm.release, name)

    def _cgroup(self, job_id: UUID, attempt: int, learner: int, epoch: int) -> Cgroup | None:
        """The learner's group: its warm sandbox's, if it started in one, or its own."""
        if self._sandbox is None:
            return None
        warm = None if self.warm is None else self.warm.of(job_id, attempt, learner, epoch)
        return self._sandbox.cgroups.group(warm or cgroup_name(job_id, attempt, learner, epoch))
