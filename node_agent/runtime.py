"""The learner runtime interface: what the agent needs to start, watch, signal and reap a
learner, whether it is a child process or a Docker container."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol
from uuid import UUID

Stream = Literal["stdout", "stderr"]


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
    env: dict[str, str]
    workdir: Path
    gpus: list[str]
    cpus: float
    memory_mb: int
    labels: dict[str, str] = field(default_factory=dict)


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


class LearnerStartError(Exception):
    """The learner could not be started at all (missing image or command, bad limits)."""


class Learner(Protocol):
    """A started learner."""

    def lines(self) -> AsyncIterator[tuple[Stream, str]]:
        """Its output, line by line (without the newline), until both streams end."""
        ...

    async def wait(self) -> ExitStatus: ...

    def signal(self, sig: signal.Signals) -> None:
        """Deliver a signal (SIGTERM to stop, SIGUSR1 for a checkpoint, SIGKILL)."""
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

    async def find(self, node: str, work_dir: Path) -> list[FoundLearner]:
        """The learners running now that an agent of `node` on `work_dir` started (this one or
        an earlier one); never those of another agent that shares the machine and the name."""
        ...

    async def adopt(self, spec: LearnerSpec, found: FoundLearner | None) -> Learner | None:
        """The learner of `spec` that an earlier agent started: running (`found`), or ended
        while no agent watched it; None when it never started. Its `lines()` begin with its
        first line."""
        ...

    async def kill(self, found: FoundLearner) -> None:
        """Kill a learner that must not run on (its job moved on while its agent was down)."""
        ...
