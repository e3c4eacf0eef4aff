"""What a user asks for when deploying a model (JSON over HTTP, the CLI's flags): validated in
full before anything is written; unknown fields are refused, so a typo never goes unnoticed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.config import JsonDict

from controlplane.deployments.names import NAME
from controlplane.jobs.images import DEFAULT_IMAGES, IMAGE_PATTERN
from controlplane.jobs.manifest import (
    MAX_CPUS,
    MAX_GPUS_PER_LEARNER,
    MAX_MEMORY_MB,
    MAX_REPLICAS,
    MIN_CPUS,
    MIN_MEMORY_MB,
    MIN_TIMEOUT_S,
    WAIT_RESOLUTION_MS,
    WaitMs,
)
from controlplane.models.references import MAX_REFERENCE_CHARS, REFERENCE_PATTERN

MAX_BATCH_SIZE = 1024
MAX_WAIT_MS = 10_000.0
MAX_MEMO_ENTRIES = 1_000_000
MAX_TASK_TIMEOUT_S = 3600.0
MAX_ITEMS = 4096
"""Items one task may carry."""
_NAME_SCHEMA: JsonDict = {"pattern": f"^{NAME.pattern}$"}
"""What `check_name` takes, stated in the document (the check stays the service's: its 422
names the field and says the rule)."""


class Resources(BaseModel):
    """What each replica holds while it runs (placed like a job's learner)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: int = Field(default=0, ge=0, le=MAX_GPUS_PER_LEARNER, description="GPUs per replica")
    cpus: float = Field(default=1.0, ge=MIN_CPUS, le=MAX_CPUS, description="CPUs per replica")
    memory_mb: int = Field(
        default=2048, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB, description="MiB per replica"
    )
    image: str = Field(
        default=DEFAULT_IMAGES,
        min_length=1,
        max_length=512,
        description="the learner image replicas run in (Docker runtime), from the operator's "
        "allowlist",
        json_schema_extra={"pattern": IMAGE_PATTERN},
    )


class Serving(BaseModel):
    """How tasks reach the model: batching, memoization and the time a replica has to answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_batch_size: int = Field(
        default=8,
        ge=1,
        le=MAX_BATCH_SIZE,
        description="most items one call of the entry point gets (a task of more items is "
        "run in several calls, each recorded as a batch)",
    )
    max_wait_ms: WaitMs = Field(
        default=5.0,
        ge=0,
        le=MAX_WAIT_MS,
        description="how long a batch that is not full waits for more items after its first "
        "(on the direct path, a request to a replica with no call in flight runs at once; "
        f"0, or {WAIT_RESOLUTION_MS:g} ms to {MAX_WAIT_MS:g} ms)",
    )
    memo: bool = Field(
        default=True,
        description="return the stored result for the same model version and input bytes",
    )
    memo_max_entries: int = Field(
        default=10_000, ge=1, le=MAX_MEMO_ENTRIES, description="memoized results kept (LRU)"
    )
    task_timeout_s: float = Field(
        default=30.0,
        ge=MIN_TIMEOUT_S,
        le=MAX_TASK_TIMEOUT_S,
        description="a replica that holds a task longer is replaced, and the task retried",
    )


MAX_TARGET_IN_FLIGHT = 10_000.0
MIN_TARGET_IN_FLIGHT = 0.01
"""A replica's least share of the load: below, the load over it overflows to infinity."""
MIN_SCALE_DOWN_DELAY_S = 1.0
MAX_SCALE_DOWN_DELAY_S = 3600.0


class Autoscaling(BaseModel):
    """Replicas that follow the load: as many as the requests in flight need at
    `target_in_flight` each, within `min_replicas` and `max_replicas` (controlplane/deployments/
    autoscaler.py). More at once; fewer only once the last change is `scale_down_delay_s` old
    (or it has been idle that long), and none (with `min_replicas` 0) only once no request has
    come or been in flight for that long."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="the fewest replicas it keeps; 0 scales it to zero when idle (a request "
        "that comes then waits for a replica to start)",
    )
    max_replicas: int = Field(
        ge=1, le=MAX_REPLICAS, description="the most replicas it grows to (at least min_replicas)"
    )
    target_in_flight: float = Field(
        default=4.0,
        ge=MIN_TARGET_IN_FLIGHT,
        le=MAX_TARGET_IN_FLIGHT,
        description="requests in flight (queued or running) each replica should have",
    )
    scale_down_delay_s: float = Field(
        default=60.0,
        ge=MIN_SCALE_DOWN_DELAY_S,
        le=MAX_SCALE_DOWN_DELAY_S,
        description="how long after its last change of replicas (or how long idle) it may have "
        "fewer, and how long it must have been idle before none",
    )

    @field_validator("max_replicas")
    @classmethod
    def _at_least_min(cls, value: int, info: ValidationInfo) -> int:
        fewest = info.data.get("min_replicas")
        if fewest is not None and value < fewest:
            raise ValueError(f"must be at least min_replicas ({fewest})")
        return value


class DeploymentRequest(BaseModel):
    """POST /v1/deployments: a model version served by `replicas` replicas, or by as many as its
    load needs (`autoscaling`; then `replicas` is not given)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        description="the deployment's name, unique in the tenant",
        json_schema_extra=_NAME_SCHEMA,
    )
    model: str = Field(
        max_length=MAX_REFERENCE_CHARS,
        json_schema_extra={"pattern": REFERENCE_PATTERN},
        description="the model version: name, name:3, name@alias, or tenant/name... for "
        "another tenant's public model; resolved once, when deployed",
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="a fixed number of replicas (not with `autoscaling`)",
    )
    resources: Resources = Field(default_factory=Resources)
    serving: Serving = Field(default_factory=Serving)
    autoscaling: Autoscaling | None = Field(
        default=None,
        description="replicas that follow the load, instead of a fixed number (`replicas` "
        "must then be left out)",
    )


class ScaleRequest(BaseModel):
    """PATCH /v1/deployments/{name}: a new number of replicas."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replicas: int = Field(ge=0, le=MAX_REPLICAS)


MAX_ROLLBACK_WINDOW_S = 86_400.0
MAX_MIN_REQUESTS = 1_000_000


class CanaryRollback(BaseModel):
    """When a canary rolls back by itself: once at least `min_requests` of its requests finished
    in the last `window_s` seconds, and more than `max_error_rate` of them failed
    (controlplane/deployments/canary.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_error_rate: float = Field(
        ge=0, le=1, description="the share of failed requests it may have (0 to 1)"
    )
    min_requests: int = Field(
        default=10,
        ge=1,
        le=MAX_MIN_REQUESTS,
        description="requests that must have finished in the window before the rate counts",
    )
    window_s: float = Field(
        default=60.0, gt=0, le=MAX_ROLLBACK_WINDOW_S, description="how far back it looks"
    )


class CanaryRequest(BaseModel):
    """PUT /v1/deployments/{name}/canary: another version of the deployment's model beside it,
    taking `weight`% of its requests on replicas of its own; again with another weight, the
    share moves."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(
        max_length=MAX_REFERENCE_CHARS,
        json_schema_extra={"pattern": REFERENCE_PATTERN},
        description="another version of the deployment's model: name:3, name@alias, ...",
    )
    weight: int = Field(ge=0, le=100, description="percent of requests the canary gets")
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS, description="the canary's replicas")
    rollback: CanaryRollback | None = Field(
        default=None,
        description="when it rolls back by itself; left out, only by command (DELETE)",
    )


class PipelineRequest(BaseModel):
    """POST /v1/pipelines: deployments run in order, each step's outputs the next's inputs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(json_schema_extra=_NAME_SCHEMA)
    steps: list[str] = Field(
        min_length=1,
        max_length=16,
        description="deployment names",
        json_schema_extra={"items": {"type": "string", **_NAME_SCHEMA}},
    )


class PredictRequest(BaseModel):
    """POST .../predict: the items for the entry point (one call takes a list of them)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    inputs: list[Any] = Field(
        min_length=1, max_length=MAX_ITEMS, description="the items, each one input"
    )
    asynchronous: bool = Field(
        default=False,
        alias="async",
        description="answer 202 with the task at once, instead of waiting for the result",
    )
    no_cache: bool = Field(
        default=False, description="run the model even if the memo has this input's result"
    )
