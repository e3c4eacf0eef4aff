"""Warm sandboxes: a learner that starts without waiting for its sandbox, its interpreter, its
launcher or its libraries (torch) to be made and imported.

An agent that is root keeps a few sandboxes ready before any claim (`node_agent.warm_pool`):
each is bubblewrap as a learner's (`Sandbox.warm_argv`), in a cgroup of its own, running
`runners.warm` as a uid held for the job that will get it (`Users.hold_warm`: the database's
placeholder, never another job's), which imports the launcher and what `--warm-import` names,
then waits on the agent's socket. It holds no job's variable and no secret: the job is not
known yet. A newly claimed job whose only learner runs here takes one (its uid becomes the
job's, `Users.adopt_warm`), and `assign` hands it the job:

1. The job's folders appear in the sandbox at their own paths. The sandbox was made with the
   agent's job roots (its work and checkpoint directories) bound from folders of a small tmpfs
   of its own, made shared (`mounts.scratch`), of which the sandbox's copies are slaves: a
   folder the agent now binds below them (`mounts.bind`), opened by walking descriptors from
   its root, shows in the sandbox, and nothing of another job's ever does.
2. Its output files become the learner's (moved into its working directory, as the agent's).
3. Its cgroup becomes the learner's, under the sandbox's name (the record below says whose), and
   takes the job's limits; what the sandbox holds already (its imports) counts against them, as
   in a cold start, and a job whose memory limit is below that starts cold. Neither renamed
   (cgroup v2 refuses to rename a group) nor moved: writing a process into another group waits
   for an RCU grace period (the kernel's lock on every thread group's cgroup), 8 to 17 ms of
   every warm start on a 2-core node.
4. The learner's environment, command and working directory go through the socket, which
   `runners.warm` then closes; it runs the launcher's phases, and a Python command of its own
   interpreter in a fork of itself, with what it imported ahead.

A warm sandbox serves one learner and is then removed with it: nothing one job did is ever seen
by another. Only a learner that its sandbox would have made the same way takes one: alone in
its job, without the network, a network across nodes, GPUs' device nodes, the operator's
`file://` roots or an environment that changes how an interpreter starts (`refusal`).

A learner started so is found again by a restarted agent from the record `assign` leaves in
the sandbox's folder (the agent's alone), checked against the process it names: its start
time and its cgroup, the sandbox's. A warm sandbox that no learner took is removed at the
agent's start; its uid is given back (`Users.release_warm`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from uuid import UUID, uuid4

from node_agent import mounts
from node_agent.cgroups import Cgroup, CgroupError, Limits
from node_agent.containers import PIDS_LIMIT
from node_agent.runtime import LOADED_WEIGHT, LearnerSpec, LearnerStartError
from node_agent.sandbox import READY_WORD, Sandbox, child_of, clear, read_all
from runners.config import WARM_IMPORTS
from runners.warm import READ_AT_START_PREFIXES, WARM

log = logging.getLogger(__name__)

FOLDER = ".warm"
"""Below the agent's work directory: a folder per warm sandbox, the agent's alone."""
PREFIX = "warm-"
ROOTS = "roots"
"""In a warm sandbox's folder: the shared mount whose folders the sandbox sees at the job roots'
paths."""
READY = "ready"
"""In a warm sandbox's folder once it is ready to be handed a learner (for an operator, and for
tests: its uid is held and its imports done)."""
RECORD = "learner.json"
"""In a warm sandbox's folder, once it has a learner: which, for a restarted agent."""
OUTPUT = ("stdout.log", "stderr.log")
"""The output files, as `process_runtime.OUTPUT_FILES` names them in a learner's folder."""
WARM_WEIGHT = LOADED_WEIGHT
"""A warm sandbox's weight against a learner's until its job's replaces it, a loaded
replica's: making one ahead is a bet on a job to come, so it takes what the node's learners
and loading replicas leave, and never slows the job that took the last one (a replica loading
its model beside its refill, `bench inference`)."""
MAKING = Limits(cpus=1.0, memory_mb=4096, pids=PIDS_LIMIT, weight=WARM_WEIGHT)
"""A warm sandbox's limits until its job's replace them: room to import torch."""
READY_S = 120.0
"""How long a warm sandbox may take to import what it preloads (torch, on a busy node)."""
STARTUP_KEPT = {"PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8"}
"""What every learner's environment has of the variables read at start (`runners.warm`'s
READ_AT_START_PREFIXES: a learner whose environment sets another starts cold, as its command
would in a new interpreter anyway), a warm sandbox's too."""
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ESCAPED = re.compile(rb"\\([0-7]{3})")


class WarmError(Exception):
    """A warm sandbox could not be made (the reason); the pool tries again later."""


@dataclass(frozen=True, slots=True)
class WarmSettings:
    python: str
    """The launcher's interpreter: what a warm sandbox runs `runners.warm` with."""
    imports: tuple[str, ...]
    """What it imports ahead (`--warm-import`), besides the launcher."""
    roots: tuple[Path, ...]
    """The agent's job roots (its work and checkpoint directories): every folder a learner that
    may start warm is given lies below one of them."""


@dataclass
class WarmSandbox:
    name: str
    placeholder: UUID
    """What holds its uid in the database until a job takes it."""
    uid: int
    folder: Path
    cgroup: Cgroup
    process: asyncio.subprocess.Process
    """bwrap, the agent's child."""
    init: int
    pid: int
    """`runners.warm`: the learner's launcher once it is handed one."""
    channel: socket.socket


@dataclass(frozen=True, slots=True)
class Record:
    """Which learner a warm sandbox was handed, and the process that runs it."""

    job_id: UUID
    attempt: int
    learner: int
    epoch: int
    pid: int
    started: int
    """The process's start time (clock ticks since boot): a pid used again is not it."""


class WarmSandboxes:
    """One agent's warm sandboxes: made, handed a learner, found after a restart, removed."""

    def __init__(self, sandbox: Sandbox, work_dir: Path, settings: WarmSettings) -> None:
        self._sandbox = sandbox
        self._base = work_dir / FOLDER
        self._settings = settings
        self._roots = _outermost(settings.roots)
        self._taken: dict[str, WarmSandbox] = {}
        """Those handed to a job's claim, by name, until its learner starts in one (or it is
        discarded, or given back)."""
        self._starting: set[str] = set()
        """Those whose learner is being started in them."""
        self._quiet = asyncio.Event()
        """Set while no sandbox is taken or starting."""
        self._quiet.set()

    def hand(self, warm: WarmSandbox) -> None:
        """`warm` is a claim's now: its learner starts in it, or it is let go."""
        self._taken[warm.name] = warm
        self._quiet.clear()

    def let_go(self, name: str) -> None:
        """The claim that took `name` gave it back, or it is being discarded."""
        self._taken.pop(name, None)
        self._settle()

    def let_go_of_all(self) -> list[WarmSandbox]:
        """Those taken by claims whose learners never started (the agent is stopping); not
        those whose learners are starting."""
        taken = list(self._taken.values())
        self._taken.clear()
        self._settle()
        return taken

    def start(self, name: str) -> WarmSandbox | None:
        """The sandbox `name` a claim took, its learner starting in it now (`started` once it
        has, or has failed to)."""
        warm = self._taken.pop(name, None)
        if warm is not None:
            self._starting.add(name)
        return warm

    def started(self, name: str) -> None:
        self._starting.discard(name)
        self._settle()

    async def quiet(self) -> None:
        """Until no sandbox is taken by a claim or has its learner starting."""
        await self._quiet.wait()

    def _settle(self) -> None:
        if not self._taken and not self._starting:
            self._quiet.set()

    def refusal(self, spec: LearnerSpec, launcher: Sequence[str]) -> str | None:
        """Why `spec` cannot start in a warm sandbox (None: it can): what its sandbox would have
        that a warm one lacks."""
        if spec.network or spec.link is not None:
            return "it uses a network"
        if spec.place is not None and spec.place.world_size > 1:
            return "its job has other learners"
        if spec.shared or not all(mount.writable for mount in spec.mounts):
            return "it is given folders of the operator's roots"
        if self._sandbox.gpus.nodes(spec.gpus):
            return "it is given GPUs' device nodes"
        if spec.command[: len(launcher) + 1] != [*launcher, "--"]:
            return "it is not run by the agent's launcher"
        for name, value in spec.env.items():
            if name.startswith(READ_AT_START_PREFIXES) and STARTUP_KEPT.get(name) != value:
                return f"its environment sets {name}"
        targets = [spec.workdir, *(mount.target for mount in spec.mounts)]
        for target in targets:
            if self._root_of(target) is None:
                return f"{target} is not below the agent's job roots"
            if any(target != other and target.is_relative_to(other) for other in targets):
                return f"{target} lies in another of its folders"
        return None

    async def make(self, placeholder: UUID, uid: int) -> WarmSandbox:
        """A warm sandbox running as `uid`, ready once this returns; WarmError if it cannot be
        made (nothing of it is left then)."""
        name = PREFIX + uuid4().hex[:16]
        folder = self._base / name
        cgroup: Cgroup | None = None
        process: asyncio.subprocess.Process | None = None
        channel: socket.socket | None = None
        try:
            self._base.mkdir(mode=0o700, exist_ok=True)
            folder.mkdir(mode=0o700)
            binds = self._shared_roots(folder)
            cgroup = self._sandbox.cgroups.create(name, MAKING)
            channel, theirs = socket.socketpair()
            info, write = os.pipe()
            try:
                with _output(folder) as output:
                    process = await asyncio.create_subprocess_exec(
                        *self._sandbox.warm_argv(binds, uid, cgroup, write, self._command()),
                        cwd="/",
                        env=self._environment(),
                        stdin=theirs.fileno(),
                        stdout=output[0],
                        stderr=output[1],
                        start_new_session=True,
                        pass_fds=(write,),
                    )
            except BaseException:
                os.close(info)
                raise
            finally:
                os.close(write)
                theirs.close()
            report = await asyncio.to_thread(read_all, info)
            if not report:
                raise WarmError(f"its sandbox did not start (exit {await process.wait()})")
            init = int(json.loads(report)["child-pid"])
            channel.setblocking(False)
            async with asyncio.timeout(READY_S):
                said = await _receive(channel, len(READY_WORD) + len(WARM))
            if said != READY_WORD + WARM:
                raise WarmError(f"it did not get ready (it said {said!r})")
            pid = child_of(init)
            if pid is None:
                raise WarmError("it ended as it got ready")
            (folder / READY).touch()
        except BaseException as exc:
            # Also when cancelled (the agent stops while the pool makes one): a sandbox half
            # made would keep its mounts, which no sweep of this agent's finds before it ends.
            await asyncio.shield(self._unmake(folder, cgroup, process, channel))
            if isinstance(
                exc, OSError | CgroupError | TimeoutError | WarmError | ValueError | KeyError
            ):
                raise WarmError(f"cannot make a warm sandbox: {exc}") from exc
            raise
        return WarmSandbox(name, placeholder, uid, folder, cgroup, process, init, pid, channel)

    async def _unmake(
        self,
        folder: Path,
        cgroup: Cgroup | None,
        process: asyncio.subprocess.Process | None,
        channel: socket.socket | None,
    ) -> None:
        """Remove what `make` made of a sandbox it could not finish."""
        if channel is not None:
            channel.close()
        if cgroup is not None:
            await clear(cgroup)
        if process is not None:
            await process.wait()
        _remove(folder)  # whatever of it was made

    def alive(self, warm: WarmSandbox) -> bool:
        """Whether `warm` still waits for a learner (the node's OOM killer, or anyone, may have
        ended it while it was idle)."""
        return warm.process.returncode is None and _start_time(warm.pid) is not None

    async def assign(
        self, warm: WarmSandbox, spec: LearnerSpec, environ: Mapping[str, str]
    ) -> Cgroup:
        """Hand `warm` the learner `spec` (its folders made, its uid the sandbox's) to run with
        `environ`: its cgroup, limited as the learner's. LearnerStartError when it cannot be
        (the sandbox is removed then: it was the job's)."""
        try:
            # What the sandbox holds already (its imports) counts against the job's memory, as
            # it would in a cold start; a limit below it would fail (v1) or kill (v2) at once.
            held = warm.cgroup.memory_used()
            if held > spec.memory_mb << 20:
                raise LearnerStartError(
                    f"its memory limit ({spec.memory_mb} MiB) is below what the sandbox holds "
                    f"already ({held >> 20} MiB)"
                )
            binds = [(spec.workdir, spec.workdir), *((m.source, m.target) for m in spec.mounts)]
            for source, target in sorted(binds, key=lambda bind: len(bind[1].parts)):
                self._bind(warm.folder, source, target)
            _move_output(self._root_of(spec.workdir), warm.folder, spec.workdir)
            # Recorded before anything of the job runs: a restarted agent finds the learner,
            # and its group, from it.
            _write_record(warm, spec)
            self._sandbox.cgroups.limit(
                warm.cgroup, Limits(cpus=spec.cpus, memory_mb=spec.memory_mb, pids=PIDS_LIMIT)
            )
            command = spec.command[spec.command.index("--") + 1 :]
            handed = {"env": dict(environ), "command": command, "cwd": str(spec.workdir)}
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(warm.channel, json.dumps(handed).encode())
            warm.channel.shutdown(socket.SHUT_WR)
        except (OSError, CgroupError, LearnerStartError) as exc:
            await self.discard(warm)
            raise LearnerStartError(f"cannot start it in its warm sandbox: {exc}") from exc
        finally:
            warm.channel.close()
        return warm.cgroup

    async def discard(self, warm: WarmSandbox) -> None:
        """Remove a warm sandbox (one no learner took, or one that failed to take it)."""
        warm.channel.close()  # `runners.warm` reads the end and exits, running nothing
        await clear(warm.cgroup)
        await warm.process.wait()
        _remove(warm.folder)

    async def release(self, name: str) -> None:
        """Remove what is left of the warm sandbox `name` once its learner is removed."""
        _remove(self._base / name)

    def found(self) -> dict[str, Record]:
        """The learners running in warm sandboxes (this agent's or an earlier one's), by
        sandbox: those whose record names a process that still runs, in the sandbox's cgroup."""
        running = {}
        for name, record in self._records().items():
            cgroup = self._sandbox.cgroups.group(name)
            if _start_time(record.pid) == record.started and record.pid in cgroup.pids():
                running[name] = record
        return running

    def of(self, job_id: UUID, attempt: int, learner: int, epoch: int) -> str | None:
        """The warm sandbox that learner was started in, if it was."""
        for name, record in self._records().items():
            if (record.job_id, record.attempt, record.learner, record.epoch) == (
                job_id,
                attempt,
                learner,
                epoch,
            ):
                return name
        return None

    async def sweep(self, keep: set[str]) -> None:
        """Remove the warm sandboxes not in `keep` (those whose learner runs, or that a claim
        holds): left by an agent that stopped or died, with whatever still runs in them."""
        if not self._base.is_dir():
            return
        held = keep | self._taken.keys() | self._starting
        for folder in sorted(self._base.iterdir()):
            if folder.name in held:
                continue
            await clear(self._sandbox.cgroups.group(folder.name))  # its learner's, if it had one
            _remove(folder)

    def _records(self) -> dict[str, Record]:
        found: dict[str, Record] = {}
        if not self._base.is_dir():
            return found
        for folder in self._base.iterdir():
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                data = json.loads((folder / RECORD).read_text())
                found[folder.name] = Record(
                    job_id=UUID(data["job_id"]),
                    attempt=int(data["attempt"]),
                    learner=int(data["learner"]),
                    epoch=int(data["epoch"]),
                    pid=int(data["pid"]),
                    started=int(data["started"]),
                )
        return found

    def _command(self) -> list[str]:
        return [self._settings.python, "-m", "runners.warm"]

    def _environment(self) -> dict[str, str]:
        """No job's variable, no secret: the node's PATH after the interpreter's folder (as a
        learner's), and what to import."""
        node_path = os.environ.get("PATH", "/usr/bin:/bin")
        return {
            "PATH": f"{os.path.dirname(self._settings.python)}:{node_path}",
            **STARTUP_KEPT,
            WARM_IMPORTS: ",".join(self._settings.imports),
        }

    def _root_of(self, path: Path) -> Path | None:
        return next((root for root in self._roots if path.is_relative_to(root)), None)

    def _shared_roots(self, folder: Path) -> list[tuple[Path, Path]]:
        """The folder's shared mount, and below it a folder for each job root, which the
        sandbox binds at the root's path."""
        shared = folder / ROOTS
        shared.mkdir(mode=0o755)
        fd = os.open(shared, _DIRECTORY)
        try:
            # A peer group of its own (the node's root may be shared, as under systemd): what
            # is bound below it propagates to its sandbox alone. In memory: the folders made
            # in it go with its unmount (one by one on the node's disk, they took a
            # millisecond each, between a learner's end and its GPUs' release).
            mounts.scratch(fd)
        finally:
            os.close(fd)
        binds = []
        for root in self._roots:
            source = _below(shared, root)
            _make_traversable(shared, source)
            binds.append((source, root))
        return binds

    def _bind(self, folder: Path, source: Path, target: Path) -> None:
        """Bind the learner's folder `source` where the sandbox sees `target`: opened by walking
        from its job root without following a symlink, so a folder swapped for a link is never
        what is bound, and mounted by its descriptor (`mounts.bind`), never by a path that
        would be resolved again; the mount point, the agent's, is walked to as well."""
        root = self._root_of(source)
        if root is None:
            raise LearnerStartError(f"{source} is not below the agent's job roots")
        shared = folder / ROOTS
        point = _below(shared, target)
        _make_traversable(shared, point)
        fd = _walk(root, source)
        try:
            at = _walk(shared, point)
            try:
                mounts.bind(fd, at)
            finally:
                os.close(at)
        finally:
            os.close(fd)


def _outermost(paths: Sequence[Path]) -> tuple[Path, ...]:
    kept: list[Path] = []
    for path in sorted(set(paths), key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(other) for other in kept):
            kept.append(path)
    return tuple(kept)


def _below(shared: Path, path: Path) -> Path:
    """Where `path` of the sandbox's view is, below the shared mount."""
    return shared / path.relative_to(path.anchor)


def _make_traversable(base: Path, path: Path) -> None:
    """Make `path` and the folders on its way below `base`, the agent's and traversable: only
    the agent makes folders here (the sandbox sees them but cannot write to them)."""
    current = base
    for name in path.relative_to(base).parts:
        current = current / name
        with contextlib.suppress(FileExistsError):
            current.mkdir(mode=0o755)
        if current.is_symlink() or not current.is_dir():
            raise OSError(f"{current} is not a folder of the agent's")


@contextlib.contextmanager
def _output(folder: Path) -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """The warm sandbox's output files, the agent's (as a learner's are), to append to."""
    with contextlib.ExitStack() as stack:
        files = []
        for name in OUTPUT:
            fd = os.open(folder / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
            files.append(stack.enter_context(os.fdopen(fd, "ab")))
        yield files[0], files[1]


def _move_output(root: Path | None, folder: Path, workdir: Path) -> None:
    """The output files, moved into the learner's working directory (the job's, below the job
    root `root`, opened by walking), where the agent reads a learner's."""
    if root is None:
        raise OSError(f"{workdir} is not below the agent's job roots")
    source = os.open(folder, _DIRECTORY)
    try:
        target = _walk(root, workdir)
        try:
            for name in OUTPUT:
                os.rename(name, name, src_dir_fd=source, dst_dir_fd=target)
        finally:
            os.close(target)
    finally:
        os.close(source)


def _write_record(warm: WarmSandbox, spec: LearnerSpec) -> None:
    record = {
        "job_id": str(spec.job_id),
        "attempt": spec.attempt,
        "learner": spec.learner,
        "epoch": spec.epoch,
        "pid": warm.pid,
        "started": _start_time(warm.pid),
    }
    partial = warm.folder / (RECORD + ".partial")
    partial.write_text(json.dumps(record))
    partial.replace(warm.folder / RECORD)


def _start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), None if it has ended."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[19])


def _walk(root: Path, path: Path) -> int:
    """A descriptor of the folder `path`, opened from the agent's `root` one folder at a time
    without following a symlink (OSError where a step is not a folder)."""
    fd = os.open(root, _DIRECTORY)
    try:
        for name in path.relative_to(root).parts:
            child = os.open(name, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _mounted_below(folder: Path) -> bool:
    """Whether a mount point is `folder` or below it, as the kernel names them: the real path,
    in bytes, with mountinfo's octal escapes (of spaces, tabs, newlines, backslashes) undone."""
    real = os.fsencode(os.path.realpath(folder))
    with open("/proc/self/mountinfo", "rb") as mountinfo:
        for line in mountinfo:
            point = _ESCAPED.sub(lambda m: bytes([int(m[1], 8)]), line.split(b" ")[4])
            if point == real or point.startswith(real + b"/"):
                return True
    return False


def _remove(folder: Path) -> None:
    """Unmount what the folder holds, then remove what the agent made there; left for the next
    sweep while a mount is still there. Never a recursive removal: were a job's folder still
    bound below, removing it would remove the job's files."""
    if _mounted_below(folder):
        # By its real path, as the kernel lists it (the agent's own folders lead there).
        try:
            mounts.detach(Path(os.path.realpath(folder / ROOTS)))
        except OSError as exc:
            log.warning("warm sandbox %s: cannot unmount its folders: %s", folder.name, exc)
    if _mounted_below(folder):
        log.warning("warm sandbox %s: still mounted, left for the next sweep", folder.name)
        return
    _remove_made(folder)


def _remove_made(folder: Path) -> None:
    """Remove what the agent made in a warm sandbox's folder (its files by name, then its
    folders, emptiest first, with rmdir), leaving anything else, and saying so."""
    for name in (*OUTPUT, READY, RECORD, RECORD + ".partial"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / name)
    made = [path for path, _, _ in os.walk(folder / ROOTS)]
    for path in [*sorted(made, key=len, reverse=True), str(folder)]:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("warm sandbox %s: not removed whole: %s", folder.name, exc)
            return


async def _receive(channel: socket.socket, size: int) -> bytes:
    """Up to `size` bytes from `channel`, fewer only when it ends."""
    loop = asyncio.get_running_loop()
    said = b""
    while len(said) < size:
        more = await loop.sock_recv(channel, size - len(said))
        if not more:
            break
        said += more
    return said
