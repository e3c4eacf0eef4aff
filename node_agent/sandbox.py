"""The process runtime's sandbox: every learner (and replica) an agent that is root starts as a
process runs in bubblewrap (`bwrap`, Debian's `bubblewrap`), in a cgroup of its own, as its
job's user without capabilities. See docs/sandbox.md for why bubblewrap and what it gives.

A learner is started as

    sh -c JOIN <its cgroup's cgroup.procs files> -- [nsenter --net=NETNS --] bwrap OPTIONS --
        setpriv OPTIONS -- COMMAND

`sh`, as root, joins the learner's cgroup (in every hierarchy) and sets no core dumps, then
becomes bwrap, so that nothing of the learner ever runs outside its cgroup. A learner whose
tenant has no network becomes bwrap inside its job's network namespace on the node
(`node_agent.job_netns`: loopback alone, shared with the job's other learners there, so that
its ranks meet), through nsenter, which enters it and becomes bwrap. bwrap, as root, makes
its namespaces and its filesystem; `setpriv` then drops to the job's uid and gid, with no
supplementary groups, an empty capability bounding set and no_new_privs (bwrap's own --uid needs
a user namespace, which would map the job's uid back to root outside), and a last `sh` says the
sandbox is made and becomes `setsid` COMMAND: the command leads a session and process group of
its own, as a learner of the unsandboxed runtime does (how a restarted agent tells the launcher
from the processes it starts, see `process_runtime.find_learners`).

bwrap's init is PID 1 of the learner's pid namespace, the command PID 2: the init reaps what the
command leaves, and ends (with the command's status) once it has no process left, which the
agent sees to when the command ends (it kills what the command left in its cgroup, as a
container's end does). The agent signals the command itself: a namespace's PID 1 ignores every
signal it has no handler for, so a SIGTERM sent before the launcher installed its handler would
be lost.

Not --die-with-parent: learners outlive their agent (dependability promise 6), and the agent
re-adopts them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from uuid import UUID

import runners
from controlplane.agent_port.vocabulary import CommandFailed
from node_agent.cgroups import Cgroup, Hierarchies, find_hierarchies
from node_agent.runtime import ExitStatus, LearnerSpec

log = logging.getLogger(__name__)

JOIN = (
    'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; '
    'ulimit -c 0; exec "$@"'
)
"""Joins each cgroup.procs file given before `--` (the shell's pid is the learner's: it becomes
bwrap), then runs the rest. Exit 125 when it cannot join: no tenant code runs outside its group."""
READY = 'printf ready >&0 && exec "$@" </dev/null'
"""Run in the sandbox, as the job's user: says on its standard input (the agent's pipe) that the
sandbox is made, and becomes the rest (`setsid` and the command), whose standard input is
/dev/null (the learner never holds the pipe)."""
READY_WORD = b"ready"
WARM_READY = 'printf ready >&0 && exec "$@"'
"""READY for a warm sandbox: its command keeps its standard input, the agent's socket, on
which it is handed its job (`runners.warm`)."""
SYSTEM = (Path("/usr"), Path("/etc"))
"""The node's system, read-only: programs, libraries, their configuration."""
TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Links into /usr on a merged-/usr system (kept as the same links), folders elsewhere."""
GPU_SHARED = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
"""The driver's device nodes every CUDA process opens besides its GPUs' own."""
CLEAR_S = 10.0
"""How long a learner's cgroup may take to empty once its processes are killed."""
CLEAR_POLL_S = 0.02
KILLED = 128 + signal.SIGKILL
"""bwrap's exit code when the learner was SIGKILLed: by the agent, or by the OOM killer. The
launcher exits with it otherwise only when its command was SIGKILLed, which is an outside kill
too (as for a container, see `docker_runtime.KILLED`)."""


class SandboxMissing(CommandFailed):
    """An agent that is root has no sandbox for the process runtime: it runs no tenant code."""


@dataclass(frozen=True, slots=True)
class GpuDevices:
    """Where the NVIDIA driver lists the node's GPUs (one folder per GPU, whose `information`
    names its UUID and its device minor) and where their device nodes are. Tests point both at
    folders of their own, for fake GPUs."""

    driver: Path = Path("/proc/driver/nvidia/gpus")
    dev: Path = Path("/dev")

    def nodes(self, gpus: Sequence[str]) -> list[Path]:
        """The device nodes of `gpus` (by UUID) and the driver's shared ones, those that exist.
        A UUID the driver does not list (a fake GPU) has none."""
        if not gpus:
            return []
        minors: dict[str, str] = {}
        for information in sorted(self.driver.glob("*/information")):
            facts = dict(
                (key.strip(), value.strip())
                for key, _, value in (line.partition(":") for line in information.open())
            )
            if "GPU UUID" in facts and "Device Minor" in facts:
                minors[facts["GPU UUID"]] = facts["Device Minor"]
        own = [self.dev / f"nvidia{minors[gpu]}" for gpu in gpus if gpu in minors]
        shared = [self.dev / name for name in GPU_SHARED]
        return [node for node in [*own, *shared] if own and node.exists()]


def agent_python() -> tuple[Path, ...]:
    """What the agent's interpreter needs, which runs learners' launchers: its prefixes (a
    virtual environment's and its base's) and the folder `runners` is imported from (the
    checkout, for an editable install)."""
    found = {
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.exec_prefix),
        Path(sys.base_exec_prefix),
        Path(runners.__file__).parent.parent,
    }
    return tuple(sorted(found))


@dataclass(frozen=True, slots=True)
class Sandbox:
    bwrap: str
    setpriv: str
    setsid: str
    nsenter: str
    cgroups: Hierarchies
    gpus: GpuDevices = GpuDevices()
    readable: tuple[Path, ...] = field(default_factory=agent_python)
    """Folders learners may read besides the system (the agent's Python, the node's installed
    model requirements)."""

    @classmethod
    def open(cls, readable: Sequence[Path] = (), gpus: GpuDevices | None = None) -> Sandbox:
        """This node's sandbox, or SandboxMissing naming what it lacks; `readable`: folders
        learners may read besides the system and the agent's Python."""
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxMissing(
                "bwrap not found: apt-get install bubblewrap (an agent that is root runs "
                "tenants' code in the process runtime only in its sandbox)"
            )
        setpriv, setsid = shutil.which("setpriv"), shutil.which("setsid")
        nsenter = shutil.which("nsenter")
        if setpriv is None or setsid is None or nsenter is None:
            raise SandboxMissing("setpriv, setsid or nsenter not found: apt-get install util-linux")
        hierarchies = find_hierarchies()
        if isinstance(hierarchies, str):
            raise SandboxMissing(f"{hierarchies}: learners' limits cannot be set")
        return cls(
            bwrap=bwrap,
            setpriv=setpriv,
            setsid=setsid,
            nsenter=nsenter,
            cgroups=hierarchies,
            gpus=gpus or GpuDevices(),
            readable=(*agent_python(), *readable),
        )

    def argv(
        self, spec: LearnerSpec, cgroup: Cgroup, info_fd: int, netns: Path | None = None
    ) -> list[str]:
        """The command that runs `spec` (as its user, which it must have) in the sandbox, in
        `cgroup`, and in the network namespace `netns` (its job's) unless its tenant may use
        the network (then in the node's); bwrap writes its init's pid (outside its
        namespace; the command is the init's child) to `info_fd`, and READY_WORD comes on its
        standard input (a pipe) once the sandbox is made, just before the command runs."""
        if spec.user is None:
            raise ValueError("no user to run it as: tenants' code never runs as root")
        bwrap = [*self._network(spec, netns), self.bwrap, *self._options(spec)]
        return self._wrapped(bwrap, spec.user, cgroup, info_fd, READY, spec.command)

    def warm_argv(
        self,
        binds: Sequence[tuple[Path, Path]],
        uid: int,
        cgroup: Cgroup,
        info_fd: int,
        command: Sequence[str],
    ) -> list[str]:
        """The command that makes a warm sandbox (`node_agent.warm`): as `argv` makes a
        learner's, as `uid`, in `cgroup`, but before its job is known, so with none of a job's
        folders, no GPU and a network namespace of its own (loopback alone, as its job's would
        be: only a job whose learner is alone and has no network is given one). Each
        (source, target) of `binds` is a folder below a shared mount of the node, seen at
        `target`: what the agent mounts below the source later (the job's folders) appears
        there in the sandbox, whose copies of the mounts are their slaves. Its standard input
        stays the agent's socket (WARM_READY)."""
        options = ["--unshare-net", *self._common()]
        for source, target in sorted(binds, key=lambda bind: len(bind[1].parts)):
            options += ["--dir", str(target.parent), "--bind", str(source), str(target)]
        bwrap = [self.bwrap, *options]
        return self._wrapped(bwrap, (uid, uid), cgroup, info_fd, WARM_READY, command)

    def _wrapped(
        self,
        bwrap: list[str],
        user: tuple[int, int],
        cgroup: Cgroup,
        info_fd: int,
        ready: str,
        command: Sequence[str],
    ) -> list[str]:
        """`bwrap` run in `cgroup`, dropping to `user` inside, saying `ready`, then `command`."""
        uid, gid = user
        joins = [str(procs) for procs in cgroup.procs]
        return [
            "/bin/sh",
            "-c",
            JOIN,
            "sh",
            *joins,
            "--",
            *bwrap,
            "--info-fd",
            str(info_fd),
            "--",
            self.setpriv,
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
            "/bin/sh",
            "-c",
            ready,
            "sh",
            self.setsid,
            *command,
        ]

    def _network(self, spec: LearnerSpec, netns: Path | None) -> list[str]:
        """What runs bwrap in its job's network namespace (nothing: in the node's network)."""
        if spec.network:
            return []
        if netns is None:
            raise ValueError("a learner without the network runs in its job's namespace")
        return [self.nsenter, f"--net={netns}", "--"]

    def _options(self, spec: LearnerSpec) -> Iterator[str]:
        if spec.network:
            # Its tenant may use the network: the node's, as before the sandbox (a process has
            # no network of its job's own, as a container does); and the resolver's folder,
            # where /etc/resolv.conf often points.
            yield from ("--ro-bind-try", "/run/systemd/resolve", "/run/systemd/resolve")
        # Otherwise its job's network namespace, which nsenter entered (see `_network`).
        yield from self._common()
        for node in self.gpus.nodes(spec.gpus):
            yield from ("--dev-bind", str(node), f"/dev/{node.name}")
        binds = [(spec.workdir, spec.workdir, True)]
        binds += [(m.source, m.target, m.writable) for m in spec.mounts]
        for source, target, writable in sorted(binds, key=lambda bind: len(bind[1].parts)):
            # Folders on the way made traversable (bwrap makes them 0700 otherwise).
            yield from ("--dir", str(target.parent))
            yield from ("--bind" if writable else "--ro-bind", str(source), str(target))
        yield from ("--chdir", str(spec.workdir))

    def _common(self) -> Iterator[str]:
        """What every sandbox has, a learner's or a warm one: its namespaces, the node's system
        read-only, its own /proc, /dev, /tmp, and the folders learners may read."""
        yield from ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")
        # Its own session: no terminal of the agent's to push input into (TIOCSTI).
        yield "--new-session"
        for path in SYSTEM:
            yield from ("--ro-bind", str(path), str(path))
        for name in TOP_LEVEL:
            top = Path("/", name)
            if top.is_symlink():
                yield from ("--symlink", os.readlink(top), str(top))
            elif top.is_dir():
                yield from ("--ro-bind", str(top), str(top))
        # Read-only, and without the node's cgroups (their names are other jobs' ids).
        yield from ("--ro-bind", "/sys", "/sys", "--tmpfs", "/sys/fs/cgroup")
        # /proc of its own pid namespace: its own processes only.
        yield from ("--proc", "/proc")
        # A minimal /dev (null, zero, random, tty, pts, shm, ...); a learner's GPUs' nodes
        # come after (`_options`).
        yield from ("--dev", "/dev")
        # Scratch of its own, in memory: its pages count against its memory limit.
        yield from ("--perms", "01777", "--tmpfs", "/tmp")
        for path in _outermost(self.readable):
            # Folders on the way made traversable (bwrap makes them 0700 otherwise).
            yield from ("--dir", str(path.parent), "--ro-bind", str(path), str(path))


def _outermost(paths: Sequence[Path]) -> list[Path]:
    """The paths not within another of them, nor within the system already bound."""
    kept: list[Path] = []
    for path in sorted(set(paths), key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(other) for other in [*kept, *SYSTEM]):
            kept.append(path)
    return kept


def exit_status(returncode: int, *, oom_killed: bool) -> ExitStatus:
    """How a sandboxed learner ended, from bwrap's return code (negative: bwrap itself was
    killed, with everything in the learner's cgroup) and its cgroup's OOM count."""
    if returncode == KILLED:
        return ExitStatus(code=None, signal=signal.SIGKILL.name, oom_killed=oom_killed)
    return replace(ExitStatus.from_returncode(returncode), oom_killed=oom_killed)


def cgroup_name(job_id: UUID, attempt: int, learner: int, epoch: int) -> str:
    """A learner's cgroup: unique per claim, as a container's name is."""
    return f"{job_id}-{attempt}-{learner}-e{epoch}"


async def clear(cgroup: Cgroup) -> None:
    """Kill everything in `cgroup` and remove it, once its processes are gone (a killed process
    leaves its group only as it exits)."""
    deadline = time.monotonic() + CLEAR_S
    while cgroup.exists():
        cgroup.kill()
        if cgroup.remove():
            return
        if time.monotonic() > deadline:
            log.warning("cgroup %s still has processes %s", cgroup.memory, cgroup.pids())
            return
        await asyncio.sleep(CLEAR_POLL_S)


def child_of(init: int, proc: Path = Path("/proc")) -> int | None:
    """The one child of the sandbox's init `init`: the learner's command (None: it has ended
    already)."""
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                # "pid (comm) state ppid ...": the name may hold anything but the last ")".
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue  # ended meanwhile
            if int(fields[1]) == init:
                return int(entry.name)
    return None


def read_all(fd: int, most: int = -1) -> bytes:
    """Everything from the pipe `fd` until its writers close it, or `most` bytes; closes it."""
    with os.fdopen(fd, "rb") as pipe:
        return pipe.read(most)
