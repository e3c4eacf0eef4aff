"""Control groups for learners of the process runtime: each learner gets one of its own, with the
manifest's CPU and memory and a ceiling on its tasks, made before it starts and removed when it
has ended.

One interface over both kernels' layouts. cgroup v2 (one hierarchy, `cgroup.controllers` lists
cpu, memory and pids) is used where the node has it; v1 (one hierarchy per controller, as on this
project's CI machines) where it has only that. Learners' groups lie in a `trainyard` group at the
top of each hierarchy, as Docker's cgroupfs driver keeps its containers in `docker`: a learner
outlives its agent (promise 6), so its group cannot lie below the agent's own, which systemd
empties when the agent's service stops.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("cpu", "memory", "pids")
BASE = "trainyard"
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000
"""The kernel refuses a quota below 1 ms a period."""
MOUNTINFO = Path("/proc/self/mountinfo")


class CgroupError(Exception):
    """The node has no usable hierarchy, or a group could not be made (the reason)."""


@dataclass(frozen=True, slots=True)
class Limits:
    cpus: float
    """CPUs' worth of time a period at most (a quota)."""
    memory_mb: int
    pids: int
    weight: float = 1.0
    """Its share of busy CPUs against its sibling groups', a learner's being 1 (v1's
    cpu.shares of 1024, v2's cpu.weight of 100): a share, where `cpus` is a ceiling."""


@dataclass(frozen=True, slots=True)
class Cgroup:
    """One learner's group: a folder in each hierarchy (one in v2, one per controller in v1)."""

    folders: dict[str, Path]
    """Controller -> the group's folder in its hierarchy (one folder for all in v2)."""
    version: int

    @property
    def memory(self) -> Path:
        return self.folders["memory"]

    @property
    def procs(self) -> list[Path]:
        """The files a process writes its pid to, to join the group in every hierarchy."""
        return [folder / "cgroup.procs" for folder in self._distinct()]

    def exists(self) -> bool:
        return any(folder.is_dir() for folder in self._distinct())

    def _distinct(self) -> list[Path]:
        return list(dict.fromkeys(self.folders.values()))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs:
            with contextlib.suppress(FileNotFoundError):
                found.update(int(line) for line in procs.read_text().split())
        return found

    def memory_used(self) -> int:
        """Bytes of memory charged to it now (0 once it is gone)."""
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        try:
            return int((self.memory / name).read_text())
        except FileNotFoundError:
            return 0

    def oom_killed(self) -> bool:
        """Whether the kernel killed one of its processes for the group's memory limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            lines = (self.memory / name).read_text().splitlines()
        except FileNotFoundError:
            return False
        counts = dict(line.split(" ", 1) for line in lines if " " in line)
        return int(counts.get("oom_kill", "0")) > 0

    def kill(self) -> None:
        """SIGKILL to every process in it (v2 has one call for it; v1 has to be told each pid,
        which races with a fork: the caller repeats until `pids()` is empty)."""
        kill_file = self.memory / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            kill_file.write_text("1")
            return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def share_cpu(self, cpus: float | None, weight: float) -> None:
        """Set its CPU quota (`cpus`; None: none) and weight (`Limits.weight`) alone;
        CgroupError saying why they could not be."""
        try:
            for file, value in _cpu_settings(self, cpus, weight):
                file.write_text(value)
        except OSError as exc:
            raise CgroupError(f"cannot set the cgroup {self.memory.name}'s CPU: {exc}") from exc

    def remove(self) -> bool:
        """Remove its folders; False while a process is still in it (EBUSY)."""
        for folder in self._distinct():
            try:
                folder.rmdir()
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno == errno.EBUSY:
                    return False
                raise
        return True


@dataclass(frozen=True, slots=True)
class Hierarchies:
    """Where the node's controllers are mounted: v2's single mount, or v1's one per controller."""

    version: int
    mounts: dict[str, Path]
    """Controller -> its hierarchy's mount (the same mount for all of them in v2)."""

    def group(self, name: str) -> Cgroup:
        """The learner group called `name` (whether it exists or not)."""
        folders = {controller: self._base(controller) / name for controller in CONTROLLERS}
        return Cgroup(folders, self.version)

    def create(self, name: str, limits: Limits) -> Cgroup:
        """The group `name` made with `limits` (taken as it is if an earlier agent made it);
        CgroupError saying why it could not be."""
        group = self.group(name)
        try:
            self._make_bases()
            for folder in group.folders.values():
                folder.mkdir(exist_ok=True)
        except OSError as exc:
            raise CgroupError(f"cannot make the learner's cgroup {name}: {exc}") from exc
        self.limit(group, limits)
        return group

    def limit(self, group: Cgroup, limits: Limits) -> None:
        """Set `group`'s limits (again: a warm sandbox's group takes its job's); CgroupError
        saying why they could not be."""
        settings = list(self._settings(group, limits))
        memsw = group.memory / "memory.memsw.limit_in_bytes"
        if self.version == 1 and memsw.exists():
            # v1's memory limit may not exceed its memory+swap one: raised, that goes first.
            current = int((group.memory / "memory.limit_in_bytes").read_text())
            if limits.memory_mb << 20 > current:
                settings.sort(key=lambda setting: setting[0] != memsw)
        try:
            for file, value in settings:
                file.write_text(value)
        except OSError as exc:
            raise CgroupError(f"cannot limit the cgroup {group.memory.name}: {exc}") from exc

    def _base(self, controller: str) -> Path:
        return self.mounts[controller] / BASE

    def _make_bases(self) -> None:
        if self.version == 2:
            # v2 hands a controller to a group's children only when its parent enables it
            # for its subtree (the top's usually does already: systemd enables these).
            mount = self.mounts["memory"]
            enable = " ".join(f"+{controller}" for controller in CONTROLLERS)
            (mount / "cgroup.subtree_control").write_text(enable)
            (mount / BASE).mkdir(exist_ok=True)
            (mount / BASE / "cgroup.subtree_control").write_text(enable)
            return
        for controller in CONTROLLERS:
            self._base(controller).mkdir(exist_ok=True)

    def _settings(self, group: Cgroup, limits: Limits) -> Iterator[tuple[Path, str]]:
        yield from _cpu_settings(group, limits.cpus, limits.weight)
        memory = str(limits.memory_mb << 20)
        memory_folder, pids = group.folders["memory"], group.folders["pids"]
        if self.version == 2:
            yield memory_folder / "memory.max", memory
            if (memory_folder / "memory.swap.max").exists():
                # No swap beyond the limit, as Docker gives a container.
                yield memory_folder / "memory.swap.max", "0"
            yield pids / "pids.max", str(limits.pids)
            return
        yield memory_folder / "memory.limit_in_bytes", memory
        # Memory and swap together: the same, so no swap beyond the limit (the file is there
        # only where the kernel accounts swap). After the memory limit, which it may not be
        # below.
        if (memory_folder / "memory.memsw.limit_in_bytes").exists():
            yield memory_folder / "memory.memsw.limit_in_bytes", memory
        yield pids / "pids.max", str(limits.pids)


def _cpu_settings(group: Cgroup, cpus: float | None, weight: float) -> list[tuple[Path, str]]:
    cpu = group.folders["cpu"]
    quota = None if cpus is None else max(MIN_CPU_QUOTA_US, round(cpus * CPU_PERIOD_US))
    if group.version == 2:
        return [
            (cpu / "cpu.max", f"{'max' if quota is None else quota} {CPU_PERIOD_US}"),
            # v2's weights run from 1 to 10,000; v1's shares from 2 to 262,144.
            (cpu / "cpu.weight", str(max(1, round(100 * weight)))),
        ]
    return [
        (cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US)),
        (cpu / "cpu.cfs_quota_us", str(-1 if quota is None else quota)),
        (cpu / "cpu.shares", str(cpu_shares(weight))),
    ]


def cpu_shares(weight: float) -> int:
    """`Limits.weight` as cgroup v1's cpu.shares (a learner's 1,024; at least the kernel's 2),
    which Docker's CpuShares are too, on either version."""
    return max(2, round(1024 * weight))


def find_hierarchies(mountinfo: Path = MOUNTINFO) -> Hierarchies | str:
    """The node's hierarchies for cpu, memory and pids: v2 where its mount offers all three,
    else v1 where each is mounted; or why neither can be used."""
    v1: dict[str, Path] = {}
    v2: list[Path] = []
    for line in mountinfo.read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        parts, after = fields.split(), rest.split()
        if len(parts) < 5 or len(after) < 3:
            continue
        mount = Path(_unescape(parts[4]))
        if after[0] == "cgroup2":
            v2.append(mount)
        elif after[0] == "cgroup":
            for option in after[2].split(","):
                if option in CONTROLLERS:
                    v1.setdefault(option, mount)
    for mount in v2:
        try:
            offered = set((mount / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        if offered.issuperset(CONTROLLERS):
            return Hierarchies(2, dict.fromkeys(CONTROLLERS, mount))
    if set(v1) == set(CONTROLLERS):
        return Hierarchies(1, v1)
    missing = ", ".join(c for c in CONTROLLERS if c not in v1)
    return (
        f"no cgroup hierarchy with the {', '.join(CONTROLLERS)} controllers: no cgroup2 mount "
        f"offers them all, and cgroup v1 has no {missing}"
    )


def _unescape(path: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes."""
    for code in ("040", "011", "012", "134"):
        path = path.replace(f"\\{code}", chr(int(code, 8)))
    return path
