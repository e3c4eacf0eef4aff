"""Checkpoints of a PyTorch training run: saved atomically, verified on load, kept K at a time.

A checkpoint is two files in the checkpoint directory, numbered by a sequence that grows with
every save (so "newest" means "saved last", also after resuming from an older checkpoint):

* `ckpt-00000007.pt`: `torch.save` of the step, the state of every tracked object (model,
  optimizer, scheduler, anything with `state_dict`/`load_state_dict`) and the RNG states;
* `ckpt-00000007.json`: its manifest (step, size, sha256), written only after the data file is
  durable. The manifest is the commit record: a data file without one, or one whose size or
  checksum does not match it, is not a checkpoint.

One learner writes a checkpoint directory at a time (a learner whose assignment went stale is
killed by its agent). Should two ever overlap, they may fail each other's saves, but checksums
keep a mixed-up file from passing as a checkpoint.

Saves happen when the training loop calls `maybe_save(step)`: every `interval_seconds`, at the
first call after SIGUSR1 (a checkpoint request), and at the first call after SIGTERM, which then
ends the process with status 143 (128 + SIGTERM), as a process killed by SIGTERM would.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Literal, Protocol, cast

import torch
from pydantic import AwareDatetime, BaseModel, ConfigDict, NonNegativeInt, ValidationError

from runners import rng
from runners.channel import STDOUT, Channel, now
from runners.config import (
    DEFAULT_CHECKPOINT_INTERVAL_S,
    DEFAULT_CHECKPOINT_KEEP,
    load_checkpoint_config,
)
from runners.durable import HashingWriter, atomic_file, is_temp, sha256_file, write_bytes_atomically
from runners.protocol import CheckpointRestored, CheckpointSaved
from runners.signals import SignalRequests

FORMAT: Final = 1
_NAME = re.compile(r"ckpt-(\d{8,})\.(pt|json)")

_log = logging.getLogger(__name__)

# What signal.signal returns: a Python handler, SIG_DFL/SIG_IGN, or None for a C-level one.


class Stateful(Protocol):
    """What a checkpoint can hold: torch modules, optimizers and LR schedulers all qualify."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> object: ...


class CheckpointError(Exception):
    """A checkpoint that cannot be restored: missing, corrupt, or not this run's shape."""


@dataclass(frozen=True)
class CheckpointInfo:
    sequence: int
    step: int
    path: Path
    size_bytes: int
    sha256: str


class _Manifest(BaseModel):
    model_config = ConfigDict(frozen=True)

    format: Literal[1]
    sequence: NonNegativeInt
    step: NonNegativeInt
    size_bytes: NonNegativeInt
    sha256: str
    saved_at: AwareDatetime


def data_path(directory: Path, sequence: int) -> Path:
    return directory / f"ckpt-{sequence:08d}.pt"


def manifest_path(data: Path) -> Path:
    return data.with_suffix(".json")


class Checkpointer(SignalRequests):
    """Saves and restores the state of `state`'s objects, plus RNG states and the step.

    `step` is the number of training steps completed: restoring returns it, and the loop
    continues with that step.
    """

    def __init__(
        self,
        directory: Path | str,
        state: Mapping[str, Stateful],
        *,
        keep: int = DEFAULT_CHECKPOINT_KEEP,
        interval_seconds: float = DEFAULT_CHECKPOINT_INTERVAL_S,
        resume_from: Path | str | None = None,
        channel: Channel = STDOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds must be positive, got {interval_seconds}")
        # Absolute, because reported paths are read by the agent, whose working directory differs.
        self.directory = Path(directory).absolute()
        self.keep = keep
        self.interval_seconds = interval_seconds
        self.resume_from = None if resume_from is None else Path(resume_from).absolute()
        self._state = dict(state)
        self._channel = channel
        self._clock = clock
        self._last_save = clock()
        super().__init__()

    @classmethod
    def from_env(
        cls, state: Mapping[str, Stateful], environ: Mapping[str, str] = os.environ
    ) -> Checkpointer:
        """A checkpointer configured by the TRAINYARD_CHECKPOINT_* and TRAINYARD_RESUME_FROM
        variables that the node agent sets (see `runners.config`)."""
        config = load_checkpoint_config(environ)
        return cls(
            config.directory,
            state,
            keep=config.keep,
            interval_seconds=config.interval_seconds,
            resume_from=config.resume_from,
        )

    # Saving --------------------------------------------------------------------------------

    def maybe_save(self, step: int) -> CheckpointInfo | None:
        """Save if one is due (interval elapsed, SIGUSR1 received); after SIGTERM, save and exit.

        Call it from the training loop after each completed step, with the number of steps
        completed so far.
        """
        if self._stop_requested:
            self.save(step)
            # SystemExit, not a signal to ourselves: the script's `finally` blocks and context
            # managers still run, and the status is the one a shell reports for SIGTERM.
            raise SystemExit(128 + signal.SIGTERM)
        if self._save_requested or self._clock() - self._last_save >= self.interval_seconds:
            # Cleared before saving: a request that arrives during this save gets a save of
            # its own at the next call, never one that began before it was made.
            self._save_requested = False
            return self.save(step)
        return None

    def save(self, step: int) -> CheckpointInfo:
        """Save a checkpoint now, report it, and prune all but the newest `keep`."""
        started = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        sequence = self._next_sequence()
        path = data_path(self.directory, sequence)
        payload = {
            "format": FORMAT,
            "step": step,
            "state": {name: item.state_dict() for name, item in self._state.items()},
            "rng": rng.capture(),
        }
        with atomic_file(path) as file:
            writer = HashingWriter(file)
            # torch.save only calls write() and flush() on a file object; the writer has both
            # and hashes on the way, so the checksum costs no second read of the file.
            torch.save(payload, cast(IO[bytes], writer))
        manifest = _Manifest(
            format=FORMAT,
            sequence=sequence,
            step=step,
            size_bytes=writer.size,
            sha256=writer.hexdigest(),
            saved_at=now(),
        )
        # Written after the data file is durable (atomic_file fsyncs file and directory), so a
        # manifest never vouches for data that a crash could still lose.
        write_bytes_atomically(manifest_path(path), manifest.model_dump_json().encode())
        self._last_save = self._clock()
        self._channel.emit(
            CheckpointSaved(
                step=step,
                path=str(path),
                size_bytes=manifest.size_bytes,
                sha256=manifest.sha256,
                duration_s=time.monotonic() - started,
                at=now(),
            )
        )
        self._prune()
        return CheckpointInfo(sequence, step, path, manifest.size_bytes, manifest.sha256)

    def _next_sequence(self) -> int:
        return max(self._sequences(), default=0) + 1

    def _sequences(self, suffix: str | None = None) -> set[int]:
        found = set()
        for entry in self.directory.iterdir():
            match = _NAME.fullmatch(entry.name)
            if match is not None and suffix in (None, match.group(2)):
                found.add(int(match.group(1)))
        return found

    def _prune(self) -> None:
        committed = sorted(self._sequences("json"))
        for sequence in committed[: -self.keep]:
            path = data_path(self.directory, sequence)
            # Manifest first: a crash between the two leaves data without a manifest, which is
            # no checkpoint and is removed below next time, never a manifest without its data.
            manifest_path(path).unlink(missing_ok=True)
            path.unlink(missing_ok=True)
        # What saves that crashed left: data files without a manifest, and temporary files (this
        # save has renamed its own). With one writer per directory, nothing else is in flight.
        for sequence in self._sequences("pt") - set(committed):
            data_path(self.directory, sequence).unlink(missing_ok=True)
        for entry in self.directory.iterdir():
            if is_temp(entry):
                entry.unlink(missing_ok=True)

    # Restoring -----------------------------------------------------------------------------

    def latest(self) -> CheckpointInfo | None:
        """The newest checkpoint in the directory that verifies, or None.

        Newer ones that fail verification (partial, corrupt) are skipped with a warning.
        """
        if not self.directory.is_dir():
            return None
        for sequence in sorted(self._sequences("json"), reverse=True):
            try:
                return verify(data_path(self.directory, sequence))
            except CheckpointError as error:
                _log.warning("skipping checkpoint: %s", error)
        return None

    def resume(self) -> int:
        """Restore `resume_from` if set, else the latest valid checkpoint; return the step.

        Returns 0 (start from scratch) when neither exists. An explicitly requested checkpoint
        that does not verify is an error, not a silent fresh start.
        """
        if self.resume_from is not None:
            return self.restore(self.resume_from)
        latest = self.latest()
        return 0 if latest is None else self.restore(latest.path)

    def restore(self, path: Path | str) -> int:
        """Load the checkpoint at `path` (a `.pt` file) into the tracked objects and RNGs."""
        info = verify(Path(path))
        payload = torch.load(info.path, map_location="cpu", weights_only=True)
        saved_state = payload.get("state") if isinstance(payload, dict) else None
        if not isinstance(saved_state, dict) or payload.get("format") != FORMAT:
            raise CheckpointError(f"{info.path} is not a format-{FORMAT} checkpoint")
        if saved_state.keys() != self._state.keys():
            raise CheckpointError(
                f"{info.path} holds state for {sorted(saved_state)}, "
                f"but this run tracks {sorted(self._state)}"
            )
        for name, item in self._state.items():
            item.load_state_dict(saved_state[name])
        rng.restore(payload["rng"])
        # The interval counts from here: the restored state is as good as a fresh save.
        self._last_save = self._clock()
        self._channel.emit(CheckpointRestored(step=info.step, path=str(info.path), at=now()))
        return info.step


def verify(path: Path) -> CheckpointInfo:
    """The checkpoint at `path` if its manifest exists and its size and sha256 match."""
    match = _NAME.fullmatch(path.name)
    if match is None or match.group(2) != "pt":
        raise CheckpointError(f"{path} is not a checkpoint file (ckpt-NNNNNNNN.pt)")
    try:
        manifest = _Manifest.model_validate_json(manifest_path(path).read_bytes())
    except (OSError, ValidationError) as error:
        raise CheckpointError(f"{path}: no valid manifest ({error})") from error
    if manifest.sequence != int(match.group(1)):
        raise CheckpointError(f"{path}: manifest is for sequence {manifest.sequence}")
    try:
        size = path.stat().st_size
        if size != manifest.size_bytes:
            raise CheckpointError(f"{path}: {size} bytes, its manifest says {manifest.size_bytes}")
        if sha256_file(path) != manifest.sha256:
            raise CheckpointError(f"{path}: sha256 does not match its manifest (corrupt)")
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read data ({error})") from error
    return CheckpointInfo(manifest.sequence, manifest.step, path, size, manifest.sha256)
