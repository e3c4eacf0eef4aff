"""The job manifest: what a user asks Trainyard to run (JSON over HTTP, YAML or JSON files)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator

Framework = Literal["pytorch", "tensorflow", "jax", "horovod", "custom"]
DATA_SCHEMES = ("file", "http", "https")
RESULTS_SCHEMES = ("file",)


def _check_scheme(uri: str, allowed: tuple[str, ...]) -> str:
    scheme = urlsplit(uri).scheme
    if scheme not in allowed:
        raise ValueError(
            f"URI scheme must be one of {', '.join(allowed)}, not {scheme or 'none'!r}"
        )
    return uri


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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
        return _check_scheme(value, DATA_SCHEMES)


class ResultsSpec(_Strict):
    location: str = Field(description="where the results directory is copied at the end (file://)")

    @field_validator("location")
    @classmethod
    def _location_scheme(cls, value: str) -> str:
        return _check_scheme(value, RESULTS_SCHEMES)


class CheckpointSpec(_Strict):
    interval_seconds: int = Field(default=600, ge=1, description="periodic checkpoint interval")
    keep: int = Field(default=3, ge=1, description="how many checkpoints to keep")


class JobManifest(_Strict):
    """A training job. Unknown fields are rejected, so a typo never goes unnoticed."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    image: str = Field(min_length=1, max_length=512, description="learner image (Docker runtime)")
    command: list[str] = Field(min_length=1, description="the training command, argv style")
    framework: Framework = "custom"
    learners: int = Field(default=1, ge=1, le=1024)
    gpus_per_learner: int = Field(default=0, ge=0, le=64)
    cpus: float = Field(default=1.0, gt=0, le=1024)
    memory_mb: int = Field(default=2048, ge=16)
    env: dict[str, str] = Field(default_factory=dict)
    data: DataSpec | None = None
    results: ResultsSpec | None = None
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    max_restarts: int = Field(default=3, ge=0, le=100)
    priority: int = Field(default=0, ge=-100, le=100, description="higher runs first")
    labels: dict[str, str] = Field(default_factory=dict)
    webhook_url: HttpUrl | None = None

    @field_validator("command")
    @classmethod
    def _command_words(cls, value: list[str]) -> list[str]:
        if not value[0]:
            raise ValueError("the program (first word) must not be empty")
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
