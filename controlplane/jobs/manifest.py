"""The job manifest: what a user asks Trainyard to run (JSON over HTTP, YAML or JSON files)."""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    ValidationInfo,
    field_validator,
)

from controlplane.jobs import uris
from controlplane.jobs.images import DEFAULT_IMAGES, IMAGE_PATTERN, IMAGES_ENV

Framework = Literal["pytorch", "tensorflow", "jax", "horovod", "custom"]
RestartOn = Literal["any_failure", "infrastructure"]
DATA_SCHEMES = ("file", "http", "https")
RESULTS_SCHEMES = ("file",)
MAX_SECRET_ENV = 64
"""Most secret environment variables a job may have."""
MAX_SECRET_ENV_BYTES = 64 * 1024
"""Most bytes (UTF-8) all of a job's secret names and values may take together."""
INT4_MAX = 2**31 - 1
"""The bound of counts Postgres stores as `integer`."""

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
"""16 TiB: no machine has more; at submission, the largest node known bounds it tighter. Claims
multiply it by `learners` (at most 1024) in bigint, and a value the job's projection cannot
store, or a claim cannot compute, would stop them for every job."""

# Bounds on every quantity a tenant submits (docs/bounds.md says why each): checked here, where
# the value enters, so that the claims, the pending reasons and the workers compute with values
# that cannot overflow, divide by zero or reach infinity. A subnormal `cpus` (a float just over
# 0) once made the pending recorder's floor(free / cpus) infinite and stopped every worker.
MIN_CPUS = 0.01
"""The least CPU share a learner can be given: Docker refuses less, and a cgroup's CPU quota is
at least 1 ms in every 100 ms period."""
MAX_CPUS = 1024.0
MIN_MEMORY_MB = 16
MAX_LEARNERS = 1024
MAX_GPUS_PER_LEARNER = 64
MAX_RESTARTS = 100
MIN_TIMEOUT_S = 1.0
"""The least time a timeout gives (deploying, a task, a query): less could not start a process."""
MAX_TIMEOUT_S = 86_400.0
MAX_WAIT_MS = 86_400_000.0
WAIT_RESOLUTION_MS = 0.001
"""A batch's wait is 0 or at least a microsecond: below that no clock tells it from 0."""
MIN_WEIGHT = 0.01
MAX_WEIGHT = 100.0
MAX_REPLICAS = 64
MAX_QUERIES = 1 << 53
"""Query indexes are counted in JSON numbers and float arithmetic: exact up to 2**53."""


def _wait_resolution(value: float) -> float:
    if 0 < value < WAIT_RESOLUTION_MS:
        raise ValueError(f"must be 0 or at least {WAIT_RESOLUTION_MS:g} ms, not {value!r}")
    return value


WaitMs = Annotated[
    float,
    AfterValidator(_wait_resolution),
    # The same rule, stated for the document: no value strictly between 0 and the resolution.
    Field(
        json_schema_extra={
            "not": {"exclusiveMinimum": 0, "exclusiveMaximum": WAIT_RESOLUTION_MS},
        }
    ),
]
"""How long a batch that is not full waits for more items, in milliseconds (each field sets
its range)."""


RESERVED_ENV = (
    # Trainyard's own: who a learner is, its fencing epoch, where its data, results and
    # checkpoints are (node_agent/runtime.py, runners/config.py).
    "TRAINYARD_*",
    # Which GPUs a learner sees (the agent sets both to exactly its allocation).
    "NVIDIA_*",
    "CUDA_VISIBLE_DEVICES",
    # The dynamic loader's and the interpreter's: LD_PRELOAD, PYTHONPATH and friends load code
    # into the launcher (the node's own Python, under the process runtime) before the user's.
    "LD_*",
    "PYTHON*",
    # What the runtimes set for every learner (node_agent/runtime.py: learner_env).
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    # torch's `env://` rendezvous, as torchrun and Ray Train set it: the agent gives every learner
    # of a job its place in the process group (runners/distributed.py reads them). A tenant's
    # RANK or MASTER_PORT would put two learners in one rank or at another job's rendezvous.
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_*",
    # Which interface gloo and NCCL open their sockets on: the agent names the job's own
    # (`job0`, node_agent/job_links.py), the only one that reaches the job's other nodes.
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
)
"""Environment names a manifest may not set (fnmatch patterns, case-sensitive as the
environment is): the agent sets them, or they change what runs before the user's command."""


def reserved_env(name: str) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in RESERVED_ENV)


def check_env_name(name: str) -> str:
    """`name` if a tenant may set it in a learner's environment; ValueError saying why not.
    The one rule for every variable a tenant names (`env`, and the secrets it refers to)."""
    if not name or "=" in name or "\0" in name:
        raise ValueError(f"invalid environment variable name {name!r}")
    if reserved_env(name):
        raise ValueError(
            f"{name} is reserved: Trainyard or the learner runtime sets it "
            f"(reserved: {', '.join(RESERVED_ENV)})"
        )
    return name


def _env_schema() -> dict[str, Any]:
    """What `check_env_name` and `_env_size` take, for JSON Schema (the reserved names' only
    wildcard is a trailing `*`, which matches line breaks too)."""
    anything = "[\\s\\S]*"
    reserved = ["^" + pattern.replace("*", anything) + "$" for pattern in RESERVED_ENV]
    return {
        "propertyNames": {
            "minLength": 1,
            "maxLength": MAX_ENV_NAME_CHARS,
            "pattern": "^[^=\\u0000]+$",
            "not": {"anyOf": [{"pattern": pattern} for pattern in reserved]},
        },
        "additionalProperties": {"type": "string", "maxLength": MAX_ENV_VALUE_CHARS},
    }


def without_reserved_env(manifest: dict[str, Any]) -> dict[str, Any]:
    """A stored manifest (as JSON data) with the environment names a manifest may no longer set
    left out: jobs submitted before they were refused carry them in the log, and the agent
    sets its own anyway, so they never took effect where it mattered."""
    env = manifest.get("env")
    if not isinstance(env, dict):
        return manifest
    return {**manifest, "env": {k: v for k, v in env.items() if not reserved_env(k)}}


EnvName = Annotated[str, AfterValidator(check_env_name)]


def _at_least(data: dict[str, Any], key: str, least: float) -> dict[str, Any]:
    value = data.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < least:
        return {**data, key: least}
    return data


def within_bounds(manifest: dict[str, Any]) -> dict[str, Any]:
    """A stored manifest (as JSON data) with the quantities accepted before their floors were
    raised (`cpus` and timeouts had only to be > 0) raised to today's floors: such a job still
    reads, and is placed and timed as it would be if submitted today. Nothing else is changed:
    every other bound is as it always was."""
    manifest = _at_least(manifest, "cpus", MIN_CPUS)
    manifest = _at_least(manifest, "deploy_timeout_s", MIN_TIMEOUT_S)
    servable = manifest.get("servable")
    if isinstance(servable, dict):
        servable = _at_least(servable, "task_timeout_s", MIN_TIMEOUT_S)
        wait = servable.get("max_wait_ms")
        if isinstance(wait, int | float) and 0 < wait < WAIT_RESOLUTION_MS:
            servable = {**servable, "max_wait_ms": 0.0}
        manifest = {**manifest, "servable": servable}
    inference = manifest.get("inference")
    if isinstance(inference, dict):
        inference = _at_least(inference, "query_timeout_s", MIN_TIMEOUT_S)
        manifest = {**manifest, "inference": inference}
    return manifest


def stored_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest stored by an older version (an event, a projection's state) as today's rules
    read it: reserved names left out, quantities within today's floors."""
    return within_bounds(without_reserved_env(manifest))


def check_storable(value: object) -> None:
    """Refuse text that Postgres jsonb cannot hold (NUL) or that cannot be encoded as UTF-8
    (unpaired surrogates, which `json.loads` lets through), anywhere in a JSON value: the
    manifest is stored in the JobSubmitted event (a task's inputs in its row), so such text
    would fail the write with a 500 after validation passed."""
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError("text must not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text must be valid Unicode (no unpaired surrogates)") from None
    elif isinstance(value, list):
        for item in value:
            check_storable(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_storable(key)
            check_storable(item)


def _check_length(what: str, text: str, most: int) -> None:
    if len(text) > most:
        raise ValueError(f"{what[:80]} has {len(text)} characters; at most {most} are allowed")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*")
    @classmethod
    def _storable(cls, value: object) -> object:
        check_storable(value)
        return value


class DataSpec(_Strict):
    source: str = Field(
        description="where the training data comes from (http(s)://, or file:// only under a "
        "data root the operator allows for the tenant, TRAINYARD_DATA_ROOTS; else 403)",
        json_schema_extra={"pattern": uris.DATA_SOURCE},
    )
    sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="checksum the download must match"
    )
    mount_path: str | None = Field(
        default=None,
        pattern=r"^/[^\x00]*$",
        description="where a container sees its data directory (an absolute path inside the "
        "container, never a node path; the process runtime ignores it)",
    )

    @field_validator("source")
    @classmethod
    def _source_scheme(cls, value: str) -> str:
        return uris.check_uri(value, DATA_SCHEMES)


class ResultsSpec(_Strict):
    location: str = Field(
        description="where the results directory is copied at the end (file://, only under a "
        "results root the operator allows for the tenant, TRAINYARD_RESULTS_ROOTS; else 403)",
        json_schema_extra={"pattern": uris.RESULTS_LOCATION},
    )

    @field_validator("location")
    @classmethod
    def _location_scheme(cls, value: str) -> str:
        return uris.check_uri(value, RESULTS_SCHEMES)


class CheckpointSpec(_Strict):
    interval_seconds: int = Field(
        default=600, ge=1, le=INT4_MAX, description="periodic checkpoint interval"
    )
    keep: int = Field(default=3, ge=1, le=INT4_MAX, description="how many checkpoints to keep")


class ServableSpec(_Strict):
    """What a deployment's replica serves (controlplane/deployments): the agent delivers the
    artifact to it and feeds it the deployment's tasks, in batches."""

    deployment: str = Field(max_length=64)
    artifact_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    entry_point: str = Field(max_length=200)
    requirements: list[str] = Field(
        default_factory=list, description="the model's packages (its metadata's)"
    )
    max_batch_size: int = Field(ge=1, le=INT4_MAX)
    max_wait_ms: WaitMs = Field(ge=0, le=MAX_WAIT_MS)
    task_timeout_s: float = Field(ge=MIN_TIMEOUT_S, le=MAX_TIMEOUT_S)
    inference_job: UUID | None = Field(
        default=None,
        description="the inference job whose queries the replica runs (controlplane/inference), "
        "instead of the deployment's tasks",
    )


class InferenceSpec(_Strict):
    """What an inference job runs (controlplane/inference), set by POST /v1/inference: the
    model version resolved once, its replicas' deployment, and its queries."""

    model: str = Field(max_length=200, description="the model reference as the user wrote it")
    model_tenant: str
    model_name: str
    version: int = Field(ge=1, le=INT4_MAX)
    deployment: str = Field(max_length=64, description="the deployment its replicas belong to")
    input: dict[str, Any] = Field(description="where its queries' items come from")
    batch_size: int = Field(ge=1, le=INT4_MAX)
    queries: int | None = Field(
        ge=1, le=MAX_QUERIES, description="how many queries; None: until cancelled"
    )
    weight: float = Field(ge=MIN_WEIGHT, le=MAX_WEIGHT)
    replicas: int = Field(ge=1, le=MAX_REPLICAS)
    query_timeout_s: float = Field(ge=MIN_TIMEOUT_S, le=MAX_TIMEOUT_S)


class HparamsSpec(_Strict):
    """Hyperparameters and a training budget, given to the learners as TRAINYARD_HPARAMS (the
    values as JSON, and a file, TRAINYARD_HPARAMS_FILE), TRAINYARD_BUDGET and
    TRAINYARD_BUDGET_UNIT: what a search sets for each trial, and what its best trial is
    exported as (GET /v1/searches/{id}/best)."""

    values: dict[str, Any] = Field(max_length=64)
    budget: int = Field(ge=1, le=10**9, description="train up to this many steps or epochs")
    unit: Literal["steps", "epochs"]

    @field_validator("values")
    @classmethod
    def _values_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(value, separators=(",", ":")))  # as the learners get it
        if size > MAX_ENV_VALUE_CHARS:
            raise ValueError(f"at most {MAX_ENV_VALUE_CHARS} characters as JSON, not {size}")
        return value


class TrialSpec(_Strict):
    """Which search trial a job runs (controlplane/searches), set by the search."""

    search_id: UUID
    number: int = Field(ge=0, le=INT4_MAX)
    rung: int = Field(ge=0, le=INT4_MAX)
    checkpoints_of: UUID = Field(
        description="the job of the trial's first rung: every rung's job keeps its checkpoints "
        "in that job's folder, so a promoted trial resumes where its last rung stopped"
    )


class JobManifest(_Strict):
    """A training job. Unknown fields are rejected, so a typo never goes unnoticed."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    image: str = Field(
        min_length=1,
        max_length=512,
        description="learner image (Docker runtime): one the operator's allowlist "
        f"{IMAGES_ENV} admits (default {DEFAULT_IMAGES}; names or patterns, optionally pinned "
        "by digest), else 422 naming `image`",
        json_schema_extra={"pattern": IMAGE_PATTERN},
    )
    command: list[str] = Field(
        min_length=1,
        max_length=MAX_COMMAND_ARGS,
        description=f"the training command, argv style (at most {MAX_COMMAND_ARGS} words of "
        f"{MAX_ARG_CHARS} characters)",
        # What the validators below check, stated in the schema: a program, then words.
        json_schema_extra={
            "prefixItems": [{"type": "string", "minLength": 1}],
            "items": {"type": "string", "maxLength": MAX_ARG_CHARS},
        },
    )
    framework: Framework = "custom"
    learners: int = Field(default=1, ge=1, le=MAX_LEARNERS)
    learners_per_node: int | None = Field(
        default=None,
        ge=1,
        le=MAX_LEARNERS,
        description="torchrun's nproc_per_node: the job runs on exactly learners / "
        "learners_per_node nodes with exactly this many learners on each (LOCAL_WORLD_SIZE), "
        "and waits for such nodes rather than splitting otherwise; at most `learners`, which "
        "must be a multiple of it. Absent: as many learners on each node as fit there",
    )
    gpus_per_learner: int = Field(default=0, ge=0, le=MAX_GPUS_PER_LEARNER)
    cpus: float = Field(
        default=1.0, ge=MIN_CPUS, le=MAX_CPUS, description="CPUs per learner (a share of one: 0.5)"
    )
    memory_mb: int = Field(
        default=2048,
        ge=MIN_MEMORY_MB,
        le=MAX_MEMORY_MB,
        description="MiB per learner; at most what the largest node has, once nodes are known",
    )
    env: dict[EnvName, str] = Field(
        default_factory=dict,
        max_length=MAX_ENV_VARS,
        description=f"at most {MAX_ENV_VARS} variables, names of {MAX_ENV_NAME_CHARS} and values "
        f"of {MAX_ENV_VALUE_CHARS} characters; names Trainyard reserves are refused "
        f"({', '.join(RESERVED_ENV)})",
        json_schema_extra=_env_schema(),
    )
    data: DataSpec | None = None
    results: ResultsSpec | None = None
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    max_restarts: int = Field(default=3, ge=0, le=MAX_RESTARTS)
    restart_on: RestartOn = Field(
        default="any_failure",
        description="which failures are retried: any_failure (a non-zero exit once the job has "
        "saved a checkpoint, and infrastructure failures) or infrastructure (only lost nodes, "
        "killed learners and runtime errors)",
    )
    deploy_timeout_s: float = Field(
        default=120.0,
        ge=MIN_TIMEOUT_S,
        le=MAX_TIMEOUT_S,
        description="every learner must have started within this many seconds of DEPLOYING, "
        "or the deployment is rolled back",
    )
    rendezvous_timeout_s: float = Field(
        default=60.0,
        ge=MIN_TIMEOUT_S,
        le=MAX_TIMEOUT_S,
        description="how long a learner waits for its peers: to meet them as the process "
        "group forms, and in every collective after (TRAINYARD_RENDEZVOUS_TIMEOUT_S); past it "
        "the learner fails with the reason instead of hanging",
    )
    deploy_retries: int = Field(
        default=2,
        ge=0,
        le=MAX_RESTARTS,
        description="deployments rolled back and retried before FAILED",
    )
    priority: int = Field(default=0, ge=-100, le=100, description="higher runs first")
    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_LABELS,
        description=f"at most {MAX_LABELS} labels, keys of {MAX_LABEL_KEY_CHARS} and values of "
        f"{MAX_LABEL_VALUE_CHARS} characters",
        json_schema_extra={
            "propertyNames": {"maxLength": MAX_LABEL_KEY_CHARS},
            "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE_CHARS},
        },
    )
    webhook_url: HttpUrl | None = None
    servable: ServableSpec | None = Field(
        default=None,
        description="set by deployments for their replicas (POST /v1/deployments); a job "
        "submitted with it is refused",
    )
    inference: InferenceSpec | None = Field(
        default=None,
        description="set for inference jobs (POST /v1/inference), which hold no node of their "
        "own; a job submitted with it is refused",
    )
    hparams: HparamsSpec | None = Field(
        default=None,
        description="hyperparameters and a budget for the learners (TRAINYARD_HPARAMS, "
        "TRAINYARD_HPARAMS_FILE, TRAINYARD_BUDGET, TRAINYARD_BUDGET_UNIT)",
    )
    trial: TrialSpec | None = Field(
        default=None,
        description="set for a search's trials (POST /v1/searches); a job submitted with it is "
        "refused",
    )

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

    @field_validator("learners_per_node")
    @classmethod
    def _whole_nodes(cls, value: int | None, info: ValidationInfo) -> int | None:
        # `learners` is validated first (declared first); absent here when it was itself invalid.
        learners = info.data.get("learners")
        if value is None or learners is None:
            return value
        if value > learners:
            raise ValueError(f"at most learners ({learners}), not {value}")
        if learners % value:
            raise ValueError(f"learners ({learners}) must be a multiple of it, not of {value}")
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

    @property
    def total_gpus(self) -> int:
        return self.learners * self.gpus_per_learner


def _submission_schema(schema: dict[str, Any]) -> None:
    """What JobSubmission's validators refuse, stated in its schema: the parts other routes
    set (null here), and the rule of a secret's name (`env`'s)."""
    properties = schema["properties"]
    for name in ("servable", "inference", "trial"):
        properties[name] = {
            "type": "null",
            "default": None,
            "description": properties[name].get("description", ""),
        }
    secrets = properties["secret_env"]
    secrets["maxProperties"] = MAX_SECRET_ENV
    # The secrets' size is bounded together (bytes), not a name's length.
    names = {k: v for k, v in _env_schema()["propertyNames"].items() if k != "maxLength"}
    secrets["propertyNames"] = names


class JobSubmission(JobManifest):
    """A manifest as submitted: with `secret_env`, which `split` takes apart from it. The
    manifest goes into the JobSubmitted event, kept forever and read by auditors; the secrets
    only to the job's learners (stored apart, deleted when the job ends)."""

    model_config = ConfigDict(json_schema_extra=_submission_schema)

    secret_env: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables given to the learners only: never in the job's "
        f"history, status or audit (at most {MAX_SECRET_ENV}, "
        f"{MAX_SECRET_ENV_BYTES // 1024} KiB together as UTF-8; no name also in env)",
    )

    @field_validator("servable")
    @classmethod
    def _not_servable(cls, value: ServableSpec | None) -> ServableSpec | None:
        if value is not None:
            raise ValueError("replicas are started by deployments: POST /v1/deployments")
        return value

    @field_validator("inference")
    @classmethod
    def _not_inference(cls, value: InferenceSpec | None) -> InferenceSpec | None:
        if value is not None:
            raise ValueError("inference jobs are submitted with POST /v1/inference")
        return value

    @field_validator("trial")
    @classmethod
    def _not_trial(cls, value: TrialSpec | None) -> TrialSpec | None:
        if value is not None:
            raise ValueError("trials are started by searches: POST /v1/searches")
        return value

    @field_validator("secret_env")
    @classmethod
    def _secret_names(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for name in value:
            check_env_name(name)
        # `env` is validated first (declared first); absent here when it was itself invalid.
        both = sorted(value.keys() & info.data.get("env", {}).keys())
        if both:
            raise ValueError(f"names in both env and secret_env: {', '.join(both)}")
        if len(value) > MAX_SECRET_ENV:
            raise ValueError(f"at most {MAX_SECRET_ENV} secret variables, not {len(value)}")
        size = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
        if size > MAX_SECRET_ENV_BYTES:
            raise ValueError(f"at most {MAX_SECRET_ENV_BYTES} bytes together, not {size}")
        return value

    def split(self) -> tuple[JobManifest, dict[str, str]]:
        """The manifest to record, and the secrets to keep apart."""
        manifest = JobManifest.model_validate(self.model_dump(exclude={"secret_env"}))
        return manifest, dict(self.secret_env)
