"""`python -m runners.launch -- COMMAND [ARG...]`: run a training command as a learner.

The launcher runs three phases and reports each one on standard output (see
`runners.protocol`):

1. DOWNLOADING: checks the configuration (`runners.config`), then fetches the data source into
   the data directory and verifies its checksum. The command never runs if this fails.
2. PROCESSING: runs the command as a child process with the same environment and standard
   streams, forwarding SIGTERM and SIGUSR1 to it (`runners.supervise`); a learner started warm
   (`runners.warm`) runs a Python command of its own interpreter in a fork of itself. A search
   trial's hyperparameters (TRAINYARD_HPARAMS, see `runners.hparams`) are first written to
   `hparams.json` in the working directory, which the command finds in TRAINYARD_HPARAMS_FILE.
3. STORING: copies the results directory to the results location.

Once a terminating signal has been received, no further phase starts. The exit status is 0 when
all phases succeeded; the command's own status when PROCESSING did not succeed (128 + N when it
was killed by signal N); 128 + N when the launcher was stopped by signal N; 1 when DOWNLOADING or
STORING failed; 2 for a usage error. The protocol lines, not the status, say which phase failed
and why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from runners import hparams
from runners.channel import STDOUT
from runners.config import EXIT_FILE, HPARAMS_FILE, ConfigError, LaunchConfig, load_launch_config
from runners.durable import write_bytes_atomically
from runners.phases import SUCCEEDED, PhaseError, PhaseResult, run_phase
from runners.protocol import Outcome, Phase, PhaseEnded
from runners.store import store
from runners.supervise import Child, ChildExit, SignalRouter, spawn
from runners.threads import fit_threads

USAGE = "usage: python -m runners.launch -- COMMAND [ARG...]"
EXIT_PHASE_FAILED = 1
EXIT_USAGE = 2
# The shell's conventions for a command that cannot be run.
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
HPARAMS_NAME = "hparams.json"

Start = Callable[[Sequence[str]], Child]
"""How PROCESSING starts the command: `spawn`, or a warm learner's fork (`runners.warm`)."""


class Launcher:
    def __init__(
        self, command: Sequence[str], environ: Mapping[str, str], start: Start = spawn
    ) -> None:
        self._command = list(command)
        self._environ = environ
        self._start = start
        self._router = SignalRouter()
        self._config: LaunchConfig | None = None
        self._trial: hparams.TrialConfig | None = None
        # What the launcher exits with when PROCESSING does not succeed; the command's own
        # status once it has run.
        self._command_status = EXIT_PHASE_FAILED

    def run(self) -> int:
        """Run the phases in order; return the exit status."""
        self._router.install()
        steps: tuple[tuple[Phase, Callable[[], PhaseResult]], ...] = (
            ("DOWNLOADING", self._download),
            ("PROCESSING", self._process),
            ("STORING", self._store),
        )
        for phase, action in steps:
            if self._router.received is not None:
                return 128 + self._router.received
            ended = run_phase(STDOUT, phase, action)
            if ended.outcome != "succeeded":
                return self._status_after(ended)
        return 0

    def _status_after(self, ended: PhaseEnded) -> int:
        if ended.phase == "PROCESSING":
            return self._command_status
        if ended.outcome == "interrupted" and self._router.received is not None:
            return 128 + self._router.received
        return EXIT_PHASE_FAILED

    def _download(self) -> PhaseResult:
        try:
            config = self._config = load_launch_config(self._environ)
            # Checked with the rest, so a malformed trial fails before its data is fetched.
            self._trial = hparams.load(self._environ)
        except ConfigError as error:
            raise PhaseError(f"invalid configuration: {error}") from error
        if config.data is not None:
            with self._router.interruptible():
                # Imported only for a job with data: HTTP's modules are a good part of the
                # launcher's start-up, which every learner (and a search's every trial) pays.
                from runners.fetch import fetch

                fetch(config.data.uri, config.data.directory, config.data.sha256)
        return SUCCEEDED

    def _process(self) -> PhaseResult:
        config = self._loaded_config()
        for directory in config.output_directories():
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise PhaseError(f"cannot create directory {directory}: {error}") from error
        if self._trial is not None:
            self._write_hparams(self._trial.hparams)
        try:
            child = self._start(self._command)
        except (OSError, subprocess.SubprocessError) as error:
            missing = isinstance(error, FileNotFoundError)
            self._command_status = EXIT_NOT_FOUND if missing else EXIT_NOT_EXECUTABLE
            raise PhaseError(f"cannot run {self._command[0]!r}: {error}") from error
        with self._router.forwarding_to(child):
            returncode = child.wait()
        ended = ChildExit.from_returncode(returncode)
        self._command_status = ended.status
        outcome: Outcome
        if returncode == 0:
            outcome = "succeeded"
        elif self._router.received is not None:
            outcome = "interrupted"
        else:
            outcome = "failed"
        return PhaseResult(
            outcome=outcome,
            error=None if returncode == 0 else ended.describe(),
            exit_code=ended.exit_code,
            signal=ended.signal,
        )

    def _write_hparams(self, point: dict[str, object]) -> None:
        """The trial's point as `hparams.json` in the working directory, named in the command's
        environment. Written whole or not at all: a launcher killed halfway leaves no truncated
        file for anything to read. Not fsynced: every attempt writes it again before its
        command starts, so only a running command reads it (two fsyncs were a millisecond or
        more of every trial's start)."""
        path = Path(HPARAMS_NAME).absolute()
        try:
            data = (json.dumps(point, indent=2) + "\n").encode()
            write_bytes_atomically(path, data, durable=False)
        except OSError as error:
            raise PhaseError(f"cannot write {path}: {error}") from error
        # The command inherits the launcher's environment (`spawn`, `fork`).
        os.environ[HPARAMS_FILE] = str(path)

    def _store(self) -> PhaseResult:
        results = self._loaded_config().results
        if results is not None and results.uri is not None:
            with self._router.interruptible():
                store(results.directory, results.uri, root=results.root)
        return SUCCEEDED

    def _loaded_config(self) -> LaunchConfig:
        # DOWNLOADING loads it; later phases only run when DOWNLOADING succeeded.
        if self._config is None:
            raise RuntimeError("the configuration is loaded by DOWNLOADING, which has not run")
        return self._config


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # The "--" is required so that launcher options can be added later without ever being
    # confused with the command's own.
    if len(args) < 2 or args[0] != "--":
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    # Before anything starts: the command, a new interpreter, inherits it.
    fit_threads()
    return run(args[1:], os.environ)


def run(command: Sequence[str], environ: Mapping[str, str], start: Start = spawn) -> int:
    """Run the phases around `command`, record the exit status (EXIT_FILE) and return it: all of
    a learner's life, started cold (`main`) or warm (`runners.warm`)."""
    status = Launcher(command, environ, start).run()
    exit_file = environ.get(EXIT_FILE)
    if exit_file:
        record_exit_status(Path(exit_file), status)
    return status


def record_exit_status(path: Path, status: int) -> None:
    """Write the status whole or not at all: a reader never sees half a number."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(f"{status}\n")
    partial.replace(path)


if __name__ == "__main__":
    sys.exit(main())
