"""Learners as real processes, their protocol lines read as they come (for tests)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from runners.protocol import Message, PhaseEnded, parse

PYTHON = sys.executable
LAUNCH = (PYTHON, "-m", "runners.launch", "--")
CLASSIFIER = (PYTHON, "-m", "runners.examples.classifier")
# A bound on how long a broken test may hang, never an expectation of how fast anything is.
PATIENCE_S = 120.0


def learner_env(variables: Mapping[str, str | Path]) -> dict[str, str]:
    """This process's environment without any TRAINYARD_* variable, plus `variables`."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("TRAINYARD_")}
    env.update({name: str(value) for name, value in variables.items()})
    return env


class Learner:
    """A process whose standard output is read line by line, as it comes."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        stderr: Path,
        *,
        stdin: int | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self._stderr_path = stderr
        with open(stderr, "wb") as stderr_file:
            # A session of its own, so that a test can kill the learner with everything it
            # started, as a crashed node or a removed container would.
            self.process = subprocess.Popen(
                list(command),
                env=dict(env),
                stdin=stdin,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=stderr_file,
                text=True,
                start_new_session=True,
            )
        self.lines: list[str] = []
        self._eof = False
        self._pending: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._pending.put(line)
        self._pending.put(None)

    def _next_line(self) -> str | None:
        if self._eof:
            return None
        line = self._pending.get(timeout=PATIENCE_S)
        if line is None:
            self._eof = True
        else:
            self.lines.append(line)
        return line

    def wait_for(self, predicate: Callable[[Message], bool]) -> Message:
        """Read lines until one carries a message that satisfies `predicate`."""
        while (line := self._next_line()) is not None:
            message = parse(line)
            if message is not None and predicate(message):
                return message
        raise AssertionError(f"the learner ended without the expected report:\n{self.output()}")

    def finish(self) -> int:
        """Read all remaining output and return the exit status."""
        while self._next_line() is not None:
            pass
        return self.process.wait(timeout=PATIENCE_S)

    def kill_all(self) -> None:
        """SIGKILL the learner and every process it started."""
        with contextlib.suppress(ProcessLookupError):  # all of them have exited already
            os.killpg(self.process.pid, signal.SIGKILL)
        self.finish()

    @property
    def messages(self) -> list[Message]:
        return [message for line in self.lines if (message := parse(line)) is not None]

    def phase_ends(self) -> dict[str, PhaseEnded]:
        return {m.phase: m for m in self.messages if isinstance(m, PhaseEnded)}

    def output(self) -> str:
        return "".join(self.lines) + self._stderr_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self._stderr_path.read_text(errors="replace")


StartLearner = Callable[..., Learner]
