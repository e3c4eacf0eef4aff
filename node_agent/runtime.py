"""The learner runtime interface: what the agent needs to start, watch, signal and reap a
learner, whether it is a child process or a Docker container."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Literal, NamedTuple, Protocol
from uuid import UUID

from node_agent.job_links import JobLink
from runners import config as runner_env

Stream = Literal["stdout", "stderr"]

# Every learner's environment names its node, job, attempt, learner and fencing epoch.
NODE = "TRAINYARD_NODE"
JOB_ID = "TRAINYARD_JOB_ID"
ATTEMPT = "TRAINYARD_ATTEMPT"
LEARNER = "TRAINYARD_LEARNER"
EPOCH = "TRAINYARD_EPOCH"

TORCH_NAMES = {
    "MASTER_ADDR": runner_env.MASTER_ADDR,
    "MASTER_PORT": runner_env.MASTER_PORT,
    "RANK": runner_env.RANK,
    "WORLD_SIZE": runner_env.WORLD_SIZE,
    "LOCAL_RANK": runner_env.LOCAL_RANK,
    "LOCAL_WORLD_SIZE": runner_env.LOCAL_WORLD_SIZE,
    "NODE_RANK": runner_env.NODE_RANK,
}
"""torch's `env://` names (as torchrun sets them) and their Trainyard twins: a learner gets both."""


class LearnerLine(NamedTuple):
    """One line of a learner's output (without the newline) and when it was written."""

    stream: Stream
    text: str
    at: datetime


@dataclass(frozen=True, slots=True)
class Mount:
    """A node path a container sees at `target`: one of the agent's own folders for the job, or
    an operator's root. Never a path the tenant chose. A process sees it there too, in its
    sandbox (`node_agent.sandbox`)."""

    source: Path
    target: Path
    writable: bool

    @classmethod
    def same(cls, path: Path, *, writable: bool) -> Mount:
        """Seen at the same path inside (so that paths in the learner's environment and in its
        checkpoint reports mean the same inside and out)."""
        return cls(path, path, writable)


@dataclass(frozen=True, slots=True)
class Folder:
    """A folder the agent makes for the job before its learner starts: `path`, below `base`
    (the agent's work or checkpoint directory), each level owned by the job's user, mode
    0700, made without following symlinks."""

    base: Path
    path: Path
    adopt: bool = False
    """Its files were left by an earlier job of the same search trial (another user): they
    become this job's user's."""


@dataclass(frozen=True, slots=True)
class Shared:
    """A `file://` location of the job on the node, which must lie under one of the operator's
    `roots` for `tenant` (checked again on the node, after resolving symlinks, before the
    learner starts); a container then sees that root, at the same path."""

    path: Path
    roots: tuple[str, ...]
    tenant: str
    writable: bool
    field: str
    """The manifest field it came from (for the reason an attempt fails)."""
    setting: str
    """The operator's setting that lists the roots."""


@dataclass(frozen=True, slots=True)
class Place:
    """A learner's place in its job's process group: torch's `env://` contract, which
    `runners.distributed` reads (see `node_agent.rendezvous` for how the agent chooses it)."""

    rank: int
    """The learner's index in its job."""
    world_size: int
    """The job's learners."""
    local_rank: int
    """Its index among its job's learners on this node."""
    local_world_size: int
    node_rank: int
    """Its node's index among the job's nodes (ordered by the first learner on each)."""
    master_addr: str
    """Where rank 0 keeps the rendezvous: an address every learner of the job can reach."""
    master_port: int
    timeout_s: float
    """How long the rendezvous (and every collective) may wait for a peer."""
    interface: str | None = None
    """The job's interface to its other nodes (`node_agent.job_links`), which gloo and NCCL
    must use (they would take the node's host name's address, which is not the job's); None:
    one node, loopback."""

    def env(self) -> dict[str, str]:
        values = {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
        }
        twins = {TORCH_NAMES[name]: value for name, value in values.items()}
        if self.interface is not None:
            values |= {"GLOO_SOCKET_IFNAME": self.interface, "NCCL_SOCKET_IFNAME": self.interface}
        return {**values, **twins, runner_env.RENDEZVOUS_TIMEOUT_S: f"{self.timeout_s:g}"}


@dataclass(frozen=True, slots=True)
class LearnerSpec:
    """One learner of one job attempt, as the agent wants it run."""

    job_id: UUID
    attempt: int
    learner: int
    epoch: int
    node: str
    image: str
    command: list[str]
    env: dict[str, str] = field(repr=False)  # holds the job's secrets: never logged
    workdir: Path
    gpus: list[str]
    cpus: float
    memory_mb: int
    labels: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    network: bool = False
    """Whether the learner may use the network (its tenant is allowed to); a container, or a
    process in its sandbox, has none otherwise."""
    user: tuple[int, int] | None = None
    """The uid and gid it runs as (the job's, see `node_agent.users`); None: the agent's own
    (an agent that is not root cannot hand out others)."""
    folders: list[Folder] = field(default_factory=list)
    shared: list[Shared] = field(default_factory=list)
    packages: tuple[str, ...] = ()
    """A deployment's replica: the requirements its model lists (a container runs an image
    with them installed; a process is given them by its agent as it loads the model)."""
    place: Place | None = None
    """Its place in its job's process group; None: a deployment's replica, which has none."""
    link: JobLink | None = None
    """Its node's part of its job's network across nodes (the process runtime's sandboxed
    learners of a job whose learners span nodes); None: its job's network is this node's."""
    warm: str | None = None
    """The warm sandbox it starts in (`node_agent.warm`; the process runtime, sandboxed), which
    its claim took; None: a sandbox (or container) made for it."""


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a learner ended: an exit code, or the signal that killed it."""

    code: int | None
    signal: str | None = None
    oom_killed: bool = False

    @property
    def succeeded(self) -> bool:
        return self.code == 0

    @property
    def unknown(self) -> bool:
        """It ended while no agent watched and left no status (killed outright, say)."""
        return self.code is None and self.signal is None

    def describe(self) -> str:
        if self.oom_killed:
            return "killed for using too much memory (OOM)"
        if self.signal is not None:
            return f"killed by {self.signal}"
        if self.unknown:
            return "ended while its agent was down, leaving no exit status"
        return f"exited with code {self.code}"

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        """asyncio's convention: a negative return code is the number of the killing signal."""
        if returncode < 0:
            return cls(code=None, signal=signal.Signals(-returncode).name)
        return cls(code=returncode)


def learner_env(spec: LearnerSpec, *, path: str | None) -> dict[str, str]:
    """The learner's environment: the spec's, then Trainyard's, last, so that no name in a
    manifest overrides what the agent sets (the control plane refuses those names too, see
    `manifest.RESERVED_ENV`). `path` is its PATH, or None to keep the one its image sets (a
    container's programs are where its image put them, not where the node has its own)."""
    visible = ",".join(spec.gpus)
    base = {"PATH": path} if path is not None else {}
    return {
        **spec.env,
        **base,
        "HOME": str(spec.workdir),
        # A learner's uid has no passwd entry (node_agent.users): libraries that ask who runs
        # them (getpass.getuser(), as torch does for its kernel cache on a GPU) read these.
        "USER": user_name(spec.user),
        "LOGNAME": user_name(spec.user),
        "LANG": "C.UTF-8",
        # Unbuffered, so that lines (and protocol reports) arrive as they are written.
        "PYTHONUNBUFFERED": "1",
        # Exactly this learner's GPUs; an empty value hides every GPU from CUDA.
        "CUDA_VISIBLE_DEVICES": visible,
        "NVIDIA_VISIBLE_DEVICES": visible or "void",
        NODE: spec.node,
        runner_env.CPUS: f"{spec.cpus:g}",
        JOB_ID: str(spec.job_id),
        ATTEMPT: str(spec.attempt),
        LEARNER: str(spec.learner),
        EPOCH: str(spec.epoch),
        **(spec.place.env() if spec.place is not None else {}),
    }


def user_name(user: tuple[int, int] | None) -> str:
    """The name a learner goes by in its environment: its uid's, or the agent's own."""
    return "trainyard-learner" if user is None else f"trainyard-{user[0]}"


class LearnerStartError(Exception):
    """The learner could not be started at all (missing image or command, bad limits)."""


class CpuShare(Enum):
    """A serving replica's claim on its node's CPUs as it loads its model, then serves. A
    node's busy CPUs go first to the replicas still loading (a new job starts sooner, a
    replica that died is replaced sooner), then to every learner's compute, then to the
    loaded replicas' model compute (as `runners.serve._yield_cpu` orders threads by their
    niceness, where no cgroup holds them)."""

    LOADING = "loading"
    """No CPU quota, a learner's weight: the node's idle CPUs and a learner's share of the
    busy ones (bounded in time by the agent: `serving.LOAD_BOOST_S`)."""
    SERVING = "serving"
    """Its own CPUs at most, at LOADED_WEIGHT."""

    def limits(self, cpus: float | None) -> tuple[float | None, float]:
        """The CPU quota (None: none) and weight (`cgroups.Limits.weight`) of a replica of
        `cpus` CPUs (None: no quota of its own) in this share."""
        if self is CpuShare.LOADING:
            return None, 1.0
        return cpus, LOADED_WEIGHT


LOADED_WEIGHT = 110 / 1024
"""A loaded replica's weight against a learner's: the kernel's for a thread of niceness 10
(`runners.serve.LOADED_NICE`) against one of 0."""


class Learner(Protocol):
    """A started learner."""

    def lines(self) -> AsyncIterator[LearnerLine]:
        """Its output, line by line, until both streams end."""
        ...

    async def wait(self) -> ExitStatus: ...

    def signal(self, sig: signal.Signals) -> None:
        """Deliver a signal (SIGTERM to stop, SIGUSR1 for a checkpoint, SIGKILL)."""
        ...

    async def remove(self) -> None:
        """Remove what the ended learner leaves behind (its container), once its lines are
        stored: until then they are the only copy."""
        ...

    async def share_cpu(self, share: CpuShare) -> None:
        """Give it `share` of the node's CPUs (a serving replica: `CpuShare`)."""
        ...


@dataclass(frozen=True, slots=True)
class FoundLearner:
    """A learner of this node that is still running, found by a (restarted) agent."""

    job_id: UUID
    attempt: int
    learner: int
    epoch: int
    handle: str
    """The runtime's own name for it: a process id, a container id."""


class LearnerRuntime(Protocol):
    name: str

    async def start(self, spec: LearnerSpec) -> Learner:
        """Start the learner; LearnerStartError if it cannot start at all."""
        ...

    async def find(self, node: str) -> list[FoundLearner]:
        """The learners running now that an agent of `node` started (this one or an earlier
        one); never those of another agent that shares the machine and the name (the process
        runtime knows its agent's work directory)."""
        ...

    async def adopt(self, spec: LearnerSpec, found: FoundLearner | None) -> Learner | None:
        """The learner of `spec` that an earlier agent started: running (`found`), or ended
        while no agent watched it; None when it never started. Its `lines()` begin with its
        first line."""
        ...

    async def kill(self, found: FoundLearner) -> None:
        """Kill a learner that must not run on (its job moved on while its agent was down)."""
        ...
