"""The learner's configuration: the environment variables the node agent sets, and their parsing.

Every variable the runtime reads is named here, once. An empty value counts as unset, because
container runtimes and compose files often pass a variable through as "" rather than leave it out.
Parsing is pure (it takes the environment as a mapping) so each rule is tested without processes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runners.uri import UriError, file_path, require_scheme

DATA_URI = "TRAINYARD_DATA_URI"
DATA_SHA256 = "TRAINYARD_DATA_SHA256"
DATA_DIR = "TRAINYARD_DATA_DIR"
RESULTS_DIR = "TRAINYARD_RESULTS_DIR"
RESULTS_URI = "TRAINYARD_RESULTS_URI"
RESULTS_ROOT = "TRAINYARD_RESULTS_ROOT"
"""The operator's root that the results location lies under (set by the agent): the launcher
stores nowhere else, whatever symlinks the location has come to pass through."""
CHECKPOINT_DIR = "TRAINYARD_CHECKPOINT_DIR"
CHECKPOINT_INTERVAL = "TRAINYARD_CHECKPOINT_INTERVAL"
CHECKPOINT_KEEP = "TRAINYARD_CHECKPOINT_KEEP"
RESUME_FROM = "TRAINYARD_RESUME_FROM"
EXIT_FILE = "TRAINYARD_EXIT_FILE"
"""Where the launcher writes its exit status as it ends, for an agent that is not its parent
(one restarted while the learner ran) to read."""
SERVE_DIR = "TRAINYARD_SERVE_DIR"
"""A serving replica's folder (`python -m runners.serve`): it listens on `serve.sock` there and
keeps the model it is given under `model/`."""
CPUS = "TRAINYARD_CPUS"
"""The CPUs' worth of time the learner's cgroup allows it (its manifest's `cpus`, a decimal): what
its thread pools should be sized to. A serving replica sizes its model's to it (`runners.serve`)."""
WARM_IMPORTS = "TRAINYARD_WARM_IMPORTS"
"""The modules a warm learner (`python -m runners.warm`) imports before its job is known,
comma-separated (`torch`): set by the agent in the warm environment, never in a job's."""
HPARAMS = "TRAINYARD_HPARAMS"
"""A search trial's hyperparameters: its point, one JSON object (see `runners.hparams`)."""
HPARAMS_FILE = "TRAINYARD_HPARAMS_FILE"
"""Where the launcher wrote the trial's hyperparameters (`hparams.json`, absolute), for commands
that would rather read a file than the environment; TRAINYARD_HPARAMS wins when both are set."""
BUDGET = "TRAINYARD_BUDGET"
"""How far a trial's job trains, counted from the trial's start: a promoted trial resumes from
its checkpoint and trains on up to this larger budget."""
BUDGET_UNIT = "TRAINYARD_BUDGET_UNIT"
"""What TRAINYARD_BUDGET counts: `steps` or `epochs`, as the learner's metric reports do."""
TRIAL = "TRAINYARD_TRIAL"
"""The trial's number within its search: informative only (logs, result files)."""

# A learner's place in its job's process group: twins of torch's `env://` names (MASTER_ADDR,
# RANK, ...), which win when both are set. The agent sets both; a script that reads only one
# family still finds its place (see `runners.distributed`).
MASTER_ADDR = "TRAINYARD_MASTER_ADDR"
MASTER_PORT = "TRAINYARD_MASTER_PORT"
RANK = "TRAINYARD_RANK"
WORLD_SIZE = "TRAINYARD_WORLD_SIZE"
LOCAL_RANK = "TRAINYARD_LOCAL_RANK"
LOCAL_WORLD_SIZE = "TRAINYARD_LOCAL_WORLD_SIZE"
NODE_RANK = "TRAINYARD_NODE_RANK"
RENDEZVOUS_TIMEOUT_S = "TRAINYARD_RENDEZVOUS_TIMEOUT_S"
"""Seconds a learner waits for its peers at the rendezvous, and for any collective after it
(the manifest's rendezvous timeout): past it, the learner fails saying so rather than hanging."""

DATA_SCHEMES = frozenset({"file", "http", "https"})
RESULTS_SCHEMES = frozenset({"file"})

DEFAULT_CHECKPOINT_INTERVAL_S = 300.0
DEFAULT_CHECKPOINT_KEEP = 3
DEFAULT_RENDEZVOUS_TIMEOUT_S = 60.0

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_DIGITS = re.compile(r"[0-9]+")


class ConfigError(ValueError):
    """An environment variable that is missing, malformed or inconsistent with the others."""


@dataclass(frozen=True)
class DataSource:
    uri: str
    sha256: str | None
    directory: Path


@dataclass(frozen=True)
class Results:
    directory: Path
    uri: str | None  # None: the command's results stay where it wrote them
    root: Path | None = None  # where the location must stay, see RESULTS_ROOT


@dataclass(frozen=True)
class LaunchConfig:
    """What the launcher needs: where data comes from, where results go, what to create."""

    data: DataSource | None
    results: Results | None
    checkpoint_dir: Path | None

    def output_directories(self) -> list[Path]:
        """The directories the command writes to, which exist before it starts."""
        found = [self.results.directory if self.results else None, self.checkpoint_dir]
        return [directory for directory in found if directory is not None]


@dataclass(frozen=True)
class CheckpointConfig:
    """What a resumable training script needs to save and restore checkpoints."""

    directory: Path
    interval_seconds: float
    keep: int
    resume_from: Path | None


def load_launch_config(environ: Mapping[str, str]) -> LaunchConfig:
    checkpoint_dir = _get(environ, CHECKPOINT_DIR)
    if checkpoint_dir is not None:
        # Not used by the launcher, but checked with the rest: a bad value then fails the job
        # before its data is fetched, not when the training script starts.
        load_checkpoint_config(environ)
    return LaunchConfig(
        data=_data_source(environ),
        results=_results(environ),
        checkpoint_dir=_path(checkpoint_dir),
    )


def load_checkpoint_config(environ: Mapping[str, str]) -> CheckpointConfig:
    directory = _get(environ, CHECKPOINT_DIR)
    if directory is None:
        raise ConfigError(f"{CHECKPOINT_DIR} must be set to save checkpoints")
    return CheckpointConfig(
        directory=Path(directory),
        interval_seconds=_positive_seconds(
            environ, CHECKPOINT_INTERVAL, DEFAULT_CHECKPOINT_INTERVAL_S
        ),
        keep=_positive_int(environ, CHECKPOINT_KEEP, DEFAULT_CHECKPOINT_KEEP),
        resume_from=_path(_get(environ, RESUME_FROM)),
    )


def _data_source(environ: Mapping[str, str]) -> DataSource | None:
    uri = _get(environ, DATA_URI)
    sha256 = _get(environ, DATA_SHA256)
    directory = _get(environ, DATA_DIR)
    if uri is None:
        if sha256 is not None:
            raise ConfigError(f"{DATA_SHA256} is set but {DATA_URI} is not")
        return None
    _check_uri(DATA_URI, uri, DATA_SCHEMES)
    if directory is None:
        raise ConfigError(f"{DATA_DIR} must be set when {DATA_URI} is")
    if sha256 is not None:
        sha256 = sha256.lower()
        if not _SHA256_HEX.fullmatch(sha256):
            raise ConfigError(f"{DATA_SHA256} must be 64 hexadecimal digits, got {sha256!r}")
    return DataSource(uri=uri, sha256=sha256, directory=Path(directory))


def _results(environ: Mapping[str, str]) -> Results | None:
    uri = _get(environ, RESULTS_URI)
    directory = _get(environ, RESULTS_DIR)
    if uri is not None:
        _check_uri(RESULTS_URI, uri, RESULTS_SCHEMES)
        if directory is None:
            raise ConfigError(f"{RESULTS_DIR} must be set when {RESULTS_URI} is")
    if directory is None:
        return None
    return Results(directory=Path(directory), uri=uri, root=_path(_get(environ, RESULTS_ROOT)))


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


def _check_uri(name: str, uri: str, supported: frozenset[str]) -> None:
    try:
        if require_scheme(uri, supported) == "file":
            file_path(uri)
    except UriError as error:
        raise ConfigError(f"{name}: {error}") from error


def _positive_seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    value = _get(environ, name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
    return seconds


def _positive_int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = _get(environ, name)
    if value is None:
        return default
    if not _DIGITS.fullmatch(value) or int(value) < 1:
        raise ConfigError(f"{name} must be a whole number of at least 1, got {value!r}")
    return int(value)
