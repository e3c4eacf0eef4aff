"""The job manifest: what a user asks Trainyard to run (JSON over HTTP, YAML or JSON files)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator

Framework = Literal["pytorch", "tensorflow", "jax", "horovod", "custom"]
RestartOn = Literal["any_failure", "infrastructure"]
DATA_SCHEMES = ("file", "http", "https")
RESULTS_SCHEMES = ("file",)

# Bounds on a manifest's sizes: it is stored in the job's JobSubmitted event and read by every
# replay of the job, and the learners get it as argv and environment (which the kernel caps at
# a few MiB in all). Generous for real jobs, small enough that no one bloats the log with one.
MAX_COMMAND_ARGS = 1024
MAX_ARG_CHARS = 16_384
MAX_ENV_VARS = 256
MAX_ENV_NAME_CHARS = 256
MAX_ENV_VALUE_CHARS = 32_768
MAX_LABELS = 64
MAX_LABEL_KEY_CHARS = 63
MAX_LABEL_VALUE_CHARS = 256
MAX_MEMORY_MB = 16 * 1024 * 1024
"""16 TiB: no machine has more; at submission, the largest node known bounds it tighter."""


def _check_uri(uri: str, allowed: tuple[str, ...]) -> str:
    parts = urlsplit(uri)
    if parts.scheme not in allowed:
        raise ValueError(
            f"URI scheme must be one of {', '.join(allowed)}, not {parts.scheme or 'none'!r}"
        )
    # The learner refuses these same URIs (runners/uri.py), but only once the job holds GPUs and
    # reaches DOWNLOADING or STORING; refusing them here turns a wasted attempt into a 422.
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(
                f"a file URI names a path on the learner's node, e.g. file:///data/x; "
                f"{uri!r} names host {parts.netloc!r}"
            )
        path = unquote(parts.path)
        if not path.startswith("/") or not path.strip("/"):
            raise ValueError(f"{uri!r} must name an absolute path below /, e.g. file:///data/x")
    elif not parts.hostname:
        raise ValueError(f"{uri!r} names no host")
    return uri


def _check_storable(value: object) -> None:
    """Refuse text that Postgres jsonb cannot hold (NUL) or that cannot be encoded as UTF-8
    (unpaired surrogates, which `json.loads` lets through): the manifest is stored in the
    JobSubmitted event, so such text would fail the append with a 500 after validation passed."""
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError("text must not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text must be valid Unicode (no unpaired surrogates)") from None
    elif isinstance(value, list):
        for item in value:
            _check_storable(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_storable(key)
            _check_storable(item)


def _check_length(what: str, text: str, most: int) -> None:
    if len(text) > most:
        raise ValueError(f"{what[:80]} has {len(text)} characters; at most {most} are allowed")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*")
    @classmethod
    def _storable(cls, value: object) -> object:
        _check_storable(value)
        return value


class DataSpec(_Strict):
    source: str = Field(description="where the training data comes from (file://, http(s)://)")
    sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="checksum the download must match"
    )
    mount_path: str | None = Field(
        default=None, pattern=r"^/", description="where learners see the data (absolute path)"
    )

    @field_validator("source")
    @classmethod
    def _source_scheme(cls, value: str) -> str:
        return _check_uri(value, DATA_SCHEMES)


class ResultsSpec(_Strict):
    location: str = Field(description="where the results directory is copied at the end (file://)")

    @field_validator("location")
    @classmethod
    def _location_scheme(cls, value: str) -> str:
        return _check_uri(value, RESULTS_SCHEMES)


class CheckpointSpec(_Strict):
    interval_seconds: int = Field(default=600, ge=1, description="periodic checkpoint interval")
    keep: int = Field(default=3, ge=1, description="how many checkpoints to keep")


class JobManifest(_Strict):
    """A training job. Unknown fields are rejected, so a typo never goes unnoticed."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    image: str = Field(min_length=1, max_length=512, description="learner image (Docker runtime)")
    command: list[str] = Field(
        min_length=1,
        max_length=MAX_COMMAND_ARGS,
        description=f"the training command, argv style (at most {MAX_COMMAND_ARGS} words of "
        f"{MAX_ARG_CHARS} characters)",
    )
    framework: Framework = "custom"
    learners: int = Field(default=1, ge=1, le=1024)
    gpus_per_learner: int = Field(default=0, ge=0, le=64)
    cpus: float = Field(default=1.0, gt=0, le=1024)
    memory_mb: int = Field(
        default=2048,
        ge=16,
        le=MAX_MEMORY_MB,
        description="MiB per learner; at most what the largest node has, once nodes are known",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_ENV_VARS,
        description=f"at most {MAX_ENV_VARS} variables, names of {MAX_ENV_NAME_CHARS} and values "
        f"of {MAX_ENV_VALUE_CHARS} characters",
    )
    data: DataSpec | None = None
    results: ResultsSpec | None = None
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    max_restarts: int = Field(default=3, ge=0, le=100)
    restart_on: RestartOn = Field(
        default="any_failure",
        description="which failures are retried: any_failure (a non-zero exit once the job has "
        "saved a checkpoint, and infrastructure failures) or infrastructure (only lost nodes, "
        "killed learners and runtime errors)",
    )
    deploy_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=86_400,
        description="every learner must have started within this many seconds of DEPLOYING, "
        "or the deployment is rolled back",
    )
    deploy_retries: int = Field(
        default=2, ge=0, le=100, description="deployments rolled back and retried before FAILED"
    )
    priority: int = Field(default=0, ge=-100, le=100, description="higher runs first")
    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_LABELS,
        description=f"at most {MAX_LABELS} labels, keys of {MAX_LABEL_KEY_CHARS} and values of "
        f"{MAX_LABEL_VALUE_CHARS} characters",
    )
    webhook_url: HttpUrl | None = None

    @field_validator("command")
    @classmethod
    def _command_words(cls, value: list[str]) -> list[str]:
        if not value[0]:
            raise ValueError("the program (first word) must not be empty")
        return value

    # Sizes are checked apart from the rules for what a name may be: each says what it bounds.
    @field_validator("command")
    @classmethod
    def _command_size(cls, value: list[str]) -> list[str]:
        for index, word in enumerate(value):
            _check_length(f"word {index}", word, MAX_ARG_CHARS)
        return value

    @field_validator("env")
    @classmethod
    def _env_size(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            _check_length("a variable's name", name, MAX_ENV_NAME_CHARS)
            _check_length(f"the value of {name}", text, MAX_ENV_VALUE_CHARS)
        return value

    @field_validator("labels")
    @classmethod
    def _labels_size(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            _check_length("a label's key", key, MAX_LABEL_KEY_CHARS)
            _check_length(f"the value of label {key}", text, MAX_LABEL_VALUE_CHARS)
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not name or "=" in name or "\0" in name:
                raise ValueError(f"invalid environment variable name {name!r}")
        return value

    @property
    def total_gpus(self) -> int:
        return self.learners * self.gpus_per_learner
