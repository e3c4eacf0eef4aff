"""The job manifest: what is accepted, what is refused and where, all mistakes reported at once,
and manifests that survive being stored (JSON, the JobSubmitted event) unchanged."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.errors import MalformedEvent
from controlplane.jobs.events import JobSubmitted
from controlplane.jobs.lifecycle import Job, evolve
from controlplane.jobs.manifest import (
    MAX_ARG_CHARS,
    MAX_COMMAND_ARGS,
    MAX_CPUS,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_CHARS,
    MAX_ENV_VARS,
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_MEMORY_MB,
    MAX_TIMEOUT_S,
    MIN_CPUS,
    MIN_MEMORY_MB,
    MIN_TIMEOUT_S,
    CheckpointSpec,
    DataSpec,
    JobManifest,
    ResultsSpec,
    check_env_name,
    reserved_env,
)

DIGEST = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
MINIMAL: dict[str, Any] = {"name": "mnist", "image": "trainyard/pytorch:2", "command": ["train"]}
FULL: dict[str, Any] = {
    "name": "resnet50-imagenet_v2.1",
    "image": "registry.example.org/vision/resnet:2025.03",
    "command": ["python", "-m", "train", "--epochs", "90", ""],
    "framework": "pytorch",
    "learners": 4,
    "learners_per_node": 2,
    "gpus_per_learner": 8,
    "cpus": 15.5,
    "memory_mb": 262144,
    "env": {"NCCL_DEBUG": "INFO", "lower_case": "", "WITH SPACE": "fine for execve"},
    "data": {
        "source": "https://data.example.org/imagenet.tar",
        "sha256": DIGEST,
        "mount_path": "/data",
    },
    "results": {"location": "file:///srv/results/resnet"},
    "checkpoint": {"interval_seconds": 300, "keep": 5},
    "max_restarts": 10,
    "restart_on": "infrastructure",
    "deploy_timeout_s": 300.0,
    "rendezvous_timeout_s": 30.0,
    "deploy_retries": 1,
    "priority": -20,
    "labels": {"team": "vision", "cost-centre": "4711"},
    "webhook_url": "https://hooks.example.org/trainyard?token=abc",
    "servable": None,  # a deployment's replicas only
    "inference": None,  # inference jobs only (POST /v1/inference)
    "hparams": {"values": {"lr": 0.01, "layers": [{"width": 64}]}, "budget": 27, "unit": "epochs"},
    "trial": None,  # a search's trials only (POST /v1/searches)
}


def manifest(**changes: Any) -> dict[str, Any]:
    return {**MINIMAL, **changes}


def errors_of(document: dict[str, Any]) -> dict[tuple[str | int, ...], str]:
    """Every refused field's location and message; fails if the document was accepted."""
    with pytest.raises(ValidationError) as caught:
        JobManifest.model_validate(document)
    return {tuple(error["loc"]): error["msg"] for error in caught.value.errors()}


def refused_at(document: dict[str, Any], *loc: str | int) -> str:
    """The message of the one error the document has, which must be at `loc`."""
    errors = errors_of(document)
    assert list(errors) == [loc], errors
    return errors[loc]


# --- accepted manifests ------------------------------------------------------------------------


def test_a_minimal_manifest_gets_the_documented_defaults() -> None:
    job = JobManifest.model_validate(MINIMAL)
    assert (job.name, job.image, job.command) == ("mnist", "trainyard/pytorch:2", ["train"])
    assert job.framework == "custom"
    assert (job.learners, job.gpus_per_learner, job.total_gpus) == (1, 0, 0)
    assert (job.cpus, job.memory_mb) == (1.0, 2048)
    assert (job.env, job.labels) == ({}, {})
    assert (job.data, job.results, job.webhook_url) == (None, None, None)
    assert job.checkpoint == CheckpointSpec(interval_seconds=600, keep=3)
    assert (job.max_restarts, job.priority) == (3, 0)
    assert job.restart_on == "any_failure"
    assert job.rendezvous_timeout_s == 60.0  # runners.config's default, alone or in a group


def test_a_full_manifest_keeps_every_field() -> None:
    job = JobManifest.model_validate(FULL)
    assert job.total_gpus == 32
    assert job.command[-1] == ""  # only the program must be non-empty; an argument may be ""
    assert job.env["WITH SPACE"] == "fine for execve"
    assert job.data == DataSpec(source=FULL["data"]["source"], sha256=DIGEST, mount_path="/data")
    assert job.results == ResultsSpec(location="file:///srv/results/resnet")
    assert job.checkpoint == CheckpointSpec(interval_seconds=300, keep=5)
    assert str(job.webhook_url) == FULL["webhook_url"]
    dumped = job.model_dump(mode="json")
    assert {key: value for key, value in dumped.items() if key != "webhook_url"} == {
        key: value for key, value in FULL.items() if key != "webhook_url"
    }


def test_a_manifest_is_read_from_json_text() -> None:
    assert JobManifest.model_validate_json(json.dumps(FULL)) == JobManifest.model_validate(FULL)


@pytest.mark.parametrize(
    "changes",
    [
        {"learners": 1024, "gpus_per_learner": 64},
        {"gpus_per_learner": 0},
        {"priority": -100, "max_restarts": 0},
        {"priority": 100, "max_restarts": 100},
        {"cpus": MIN_CPUS, "memory_mb": MIN_MEMORY_MB},
        {"cpus": MAX_CPUS},
        {"deploy_timeout_s": MIN_TIMEOUT_S, "deploy_retries": 0},
        {"deploy_timeout_s": MAX_TIMEOUT_S, "deploy_retries": 100},
        {"name": "a"},
        {"name": "A" + "x" * 127},
        {"name": "0.1_run-B"},
        {"checkpoint": {"interval_seconds": 1, "keep": 1}},
        {"data": {"source": "file:///data/mnist"}},
        {"data": {"source": "file://localhost/data/mnist"}},
        {"data": {"source": "FILE:///data/mnist"}},
        {"data": {"source": "http://10.0.0.5:8000/mnist.npz", "sha256": DIGEST}},
        {"data": {"source": "HTTPS://Data.Example.org/x.tar"}},
        {"results": {"location": "file:///results"}},
        {"env": {"_": "", "MY_PATH": "/usr/bin:/bin", "NCCL_DEBUG": "INFO", "path": "x"}},
        {"framework": "jax"},
        {"webhook_url": "http://hooks.internal:8080/done"},
        {"memory_mb": MAX_MEMORY_MB, "restart_on": "infrastructure"},
        {"command": ["x" * MAX_ARG_CHARS] * MAX_COMMAND_ARGS},
        {"env": {f"V{i}": "" for i in range(MAX_ENV_VARS)}},
        {"env": {"N" * MAX_ENV_NAME_CHARS: "v" * MAX_ENV_VALUE_CHARS}},
        {"labels": {f"k{i}": "" for i in range(MAX_LABELS)}},
        {"labels": {"k" * MAX_LABEL_KEY_CHARS: "v" * MAX_LABEL_VALUE_CHARS}},
    ],
)
def test_values_at_and_inside_the_limits_are_accepted(changes: dict[str, Any]) -> None:
    JobManifest.model_validate(manifest(**changes))


# --- refused manifests -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "document"),
    [
        (("gpus",), manifest(gpus=1)),
        (("Name",), manifest(Name="typo")),
        (("data", "checksum"), manifest(data={"source": "file:///d", "checksum": DIGEST})),
        (("results", "path"), manifest(results={"location": "file:///r", "path": "/r"})),
        (("checkpoint", "every"), manifest(checkpoint={"every": 10})),
    ],
)
def test_unknown_fields_are_rejected_where_they_are(
    where: tuple[str, ...], document: dict[str, Any]
) -> None:
    refused_at(document, *where)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("learners", 0),
        ("learners", -1),
        ("learners", 1025),
        ("learners", 1.5),
        ("gpus_per_learner", -1),
        ("gpus_per_learner", 65),
        ("cpus", 0),
        ("cpus", 5e-324),  # subnormal: once made placement's floor(free / cpus) infinite
        ("cpus", MIN_CPUS / 2),
        ("cpus", MAX_CPUS + 1),
        ("cpus", -2.0),
        ("deploy_timeout_s", 5e-324),
        ("deploy_timeout_s", 0.5),
        ("deploy_timeout_s", MAX_TIMEOUT_S + 1),
        ("rendezvous_timeout_s", 0.5),
        ("rendezvous_timeout_s", MAX_TIMEOUT_S + 1),
        ("deploy_retries", 101),
        ("cpus", float("nan")),
        ("cpus", float("inf")),
        ("memory_mb", 15),
        ("max_restarts", -1),
        ("max_restarts", 101),
        ("priority", -101),
        ("priority", 101),
        ("framework", "pytorch2"),
        ("image", ""),
        ("image", "x" * 513),
        ("webhook_url", "ftp://hooks.example.org/x"),
        ("webhook_url", "not a url"),
        ("memory_mb", MAX_MEMORY_MB + 1),
        ("restart_on", "never"),
        ("command", ["x"] * (MAX_COMMAND_ARGS + 1)),
        ("command", ["x", "y" * (MAX_ARG_CHARS + 1)]),
        ("env", {f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}),
        ("env", {"N" * (MAX_ENV_NAME_CHARS + 1): ""}),
        ("env", {"V": "v" * (MAX_ENV_VALUE_CHARS + 1)}),
        ("labels", {f"k{i}": "" for i in range(MAX_LABELS + 1)}),
        ("labels", {"k" * (MAX_LABEL_KEY_CHARS + 1): ""}),
        ("labels", {"k": "v" * (MAX_LABEL_VALUE_CHARS + 1)}),
    ],
)
def test_numbers_and_choices_out_of_range_are_refused(field: str, value: Any) -> None:
    refused_at(manifest(**{field: value}), field)


@pytest.mark.parametrize(
    "name",
    ["", "-leading-dash", ".hidden", "_under", "has space", "a/b", "x" * 129, "é", "abc\n", "a\0"],
)
def test_names_follow_the_pattern(name: str) -> None:
    refused_at(manifest(name=name), "name")


@pytest.mark.parametrize(("learners", "per_node"), [(1, 1), (4, 2), (4, 4), (1024, 8), (6, 3)])
def test_learners_per_node_divides_the_learners(learners: int, per_node: int) -> None:
    job = JobManifest.model_validate(manifest(learners=learners, learners_per_node=per_node))
    assert (job.learners, job.learners_per_node) == (learners, per_node)


def test_without_learners_per_node_a_node_takes_as_many_as_fit() -> None:
    assert JobManifest.model_validate(manifest(learners=4)).learners_per_node is None


@pytest.mark.parametrize(
    ("learners", "per_node", "says"),
    [
        (4, 0, "greater than or equal to 1"),
        (4, -2, "greater than or equal to 1"),
        (4, 1.5, "integer"),
        (4, "two", "integer"),
        (4, 3, "learners (4) must be a multiple of it, not of 3"),
        (6, 4, "learners (6) must be a multiple of it, not of 4"),
        (4, 8, "at most learners (4), not 8"),
        (1, 2, "at most learners (1), not 2"),
    ],
)
def test_learners_per_node_that_does_not_divide_the_learners_is_refused_by_name(
    learners: int, per_node: Any, says: str
) -> None:
    assert says in refused_at(
        manifest(learners=learners, learners_per_node=per_node), "learners_per_node"
    )


def test_learners_per_node_is_not_judged_against_learners_that_were_refused() -> None:
    # The one mistake is reported, not a second one about a value it was measured against.
    errors = errors_of(manifest(learners=0, learners_per_node=2))
    assert list(errors) == [("learners",)]


def test_a_jobsubmitted_event_from_before_learners_per_node_reads_with_none() -> None:
    """Jobs stored before the field existed keep their meaning (as many on a node as fit):
    no upcaster, the default is what they always did."""
    data = {
        "at": "2026-01-01T00:00:00Z",
        "job_id": str(UUID(int=7)),
        "tenant": "acme",
        "manifest": manifest(learners=4),
    }
    decoded = EVENT_REGISTRY.decode("JobSubmitted", JobSubmitted.schema_version, json.dumps(data))
    assert isinstance(decoded, JobSubmitted)
    assert (decoded.manifest.learners, decoded.manifest.learners_per_node) == (4, None)


@pytest.mark.parametrize(
    ("command", "where"),
    [
        ([], ("command",)),
        ([""], ("command",)),
        (["", "train.py"], ("command",)),
        ("python train.py", ("command",)),  # argv style: a shell line is a mistake, not a program
        (["python", 3], ("command", 1)),
    ],
)
def test_an_empty_or_malformed_command_is_refused(
    command: Any, where: tuple[str | int, ...]
) -> None:
    refused_at(manifest(command=command), *where)


@pytest.mark.parametrize("name", ["", "A=B", "=", "A\0B"])
def test_environment_variable_names_are_checked(name: str) -> None:
    message = refused_at(manifest(env={"OK": "1", name: "x"}), "env", name, "[key]")
    assert "environment variable" in message


@pytest.mark.parametrize(
    "name",
    [
        "TRAINYARD_JOB_ID",
        "TRAINYARD_EPOCH",
        "TRAINYARD_CHECKPOINT_DIR",
        "TRAINYARD_",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "CUDA_VISIBLE_DEVICES",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONUNBUFFERED",
        "PATH",
        "HOME",
        "LANG",
        # torch's env:// rendezvous, which the agent sets for every learner
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
        "TORCHELASTIC_RESTART_COUNT",
        # the job's interface, which the agent names
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
    ],
)
def test_reserved_environment_names_are_refused_by_name(name: str) -> None:
    message = refused_at(manifest(env={"NCCL_DEBUG": "INFO", name: "x"}), "env", name, "[key]")
    assert f"{name} is reserved" in message
    assert check_env_name("NCCL_DEBUG") == "NCCL_DEBUG"
    with pytest.raises(ValueError, match="reserved"):
        check_env_name(name)


def test_a_jobsubmitted_event_of_version_1_reads_without_its_reserved_names() -> None:
    """Jobs in the log from before the names were refused: they still read, and run with
    Trainyard's values for them (their own are left out)."""
    env = {"NCCL_DEBUG": "INFO", "LD_PRELOAD": "/x.so", "TRAINYARD_EPOCH": "9", "PATH": "/p"}
    data = {
        "at": "2026-01-01T00:00:00Z",
        "job_id": str(UUID(int=7)),
        "tenant": "acme",
        "manifest": manifest(env=env),
    }
    assert JobSubmitted.schema_version == 5
    with pytest.raises(MalformedEvent):
        EVENT_REGISTRY.decode("JobSubmitted", 5, json.dumps(data))
    decoded = EVENT_REGISTRY.decode("JobSubmitted", 1, json.dumps(data))
    assert isinstance(decoded, JobSubmitted)
    assert decoded.manifest.env == {"NCCL_DEBUG": "INFO"}


def test_a_jobsubmitted_event_of_version_3_reads_without_the_rendezvous_names() -> None:
    """Jobs submitted before torch's rendezvous names were reserved: they still read, and the
    agent's values for them are the ones the learner gets."""
    env = {"NCCL_DEBUG": "INFO", "RANK": "3", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}
    data = {
        "at": "2026-01-01T00:00:00Z",
        "job_id": str(UUID(int=7)),
        "tenant": "acme",
        "manifest": manifest(env=env),
    }
    decoded = EVENT_REGISTRY.decode("JobSubmitted", 3, json.dumps(data))
    assert isinstance(decoded, JobSubmitted)
    assert decoded.manifest.env == {"NCCL_DEBUG": "INFO"}
    with pytest.raises(MalformedEvent, match=r"RANK is reserved"):
        EVENT_REGISTRY.decode("JobSubmitted", 5, json.dumps(data))


def test_a_jobsubmitted_event_of_version_4_reads_without_the_socket_interface_names() -> None:
    """Jobs submitted before gloo's and NCCL's interface names were reserved: the agent's
    (the job's own interface) are the ones the learner gets."""
    env = {"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
    data = {
        "at": "2026-01-01T00:00:00Z",
        "job_id": str(UUID(int=7)),
        "tenant": "acme",
        "manifest": manifest(env=env),
    }
    decoded = EVENT_REGISTRY.decode("JobSubmitted", 4, json.dumps(data))
    assert isinstance(decoded, JobSubmitted)
    assert decoded.manifest.env == {"NCCL_DEBUG": "INFO"}
    with pytest.raises(MalformedEvent, match=r"GLOO_SOCKET_IFNAME is reserved"):
        EVENT_REGISTRY.decode("JobSubmitted", 5, json.dumps(data))


def test_a_stored_job_state_reads_without_its_reserved_names() -> None:
    """The jobs projection and the claim queue hold states folded from such events."""
    submitted = JobSubmitted(
        job_id=UUID(int=7), tenant="acme", manifest=JobManifest(**MINIMAL), at=datetime.now(UTC)
    )
    job = evolve(None, submitted)
    stored = job.model_dump(mode="json")
    stored["manifest"]["env"] = {"A": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert Job.model_validate_json(json.dumps(stored)).manifest.env == {"A": "1"}


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("s3://bucket/key", "file, http, https"),
        ("ftp://mirror.example.org/x", "file, http, https"),
        ("/data/mnist", "none"),  # a bare path is not a URI
        ("data/mnist", "none"),
        ("C:\\data\\mnist", "file, http, https"),
        ("https://", "names a host"),
        ("https:/data.example.org/x", "names a host"),  # one slash: the host became the path
        ("file://data/mnist", "host"),  # meant ./data/mnist, names host "data"
        ("file://nfs-server/export/data", "host"),
        ("file:///", "below /"),
        ("file:data/mnist", "below /"),
    ],
)
def test_data_sources_must_be_fetchable_uris(source: str, says: str) -> None:
    message = refused_at(manifest(data={"source": source}), "data", "source")
    assert says in message


@pytest.mark.parametrize(
    "location",
    ["https://results.example.org/", "s3://bucket/out", "results", "file://out/dir", "file:///"],
)
def test_results_locations_must_be_local_file_uris(location: str) -> None:
    refused_at(manifest(results={"location": location}), "results", "location")


@pytest.mark.parametrize(
    "digest",
    [DIGEST.upper(), DIGEST[:-1], DIGEST + "0", "g" * 64, DIGEST + "\n", " " + DIGEST[1:], ""],
)
def test_a_checksum_is_64_lower_case_hex_digits(digest: str) -> None:
    refused_at(manifest(data={"source": "file:///d", "sha256": digest}), "data", "sha256")


@pytest.mark.parametrize("mount_path", ["data", "./data", ""])
def test_a_mount_path_is_absolute(mount_path: str) -> None:
    document = manifest(data={"source": "file:///d", "mount_path": mount_path})
    refused_at(document, "data", "mount_path")


@pytest.mark.parametrize(
    ("changes", "where"),
    [
        ({"command": ["python", "a\0b"]}, ("command",)),
        ({"env": {"A": "x\0"}}, ("env",)),
        ({"labels": {"team": "\0"}}, ("labels",)),
        ({"labels": {"\ud800": "x"}}, ("labels",)),
        ({"image": "img\udfff"}, ("image",)),
        ({"command": ["train", "\ud83d"]}, ("command",)),
        ({"data": {"source": "file:///d\0"}}, ("data", "source")),
        ({"data": {"source": "file:///d", "mount_path": "/d\0"}}, ("data", "mount_path")),
    ],
)
def test_text_that_cannot_be_stored_is_refused(
    changes: dict[str, Any], where: tuple[str, ...]
) -> None:
    # Postgres jsonb holds no NUL and JSON no unpaired surrogate: accepting either would fail the
    # JobSubmitted append after the manifest was found valid (a 500 instead of a 422).
    refused_at(manifest(**changes), *where)


def test_a_manifest_with_several_mistakes_reports_every_one() -> None:
    document = {
        "name": "-bad",
        "image": "",
        "command": [],
        "framework": "caffe",
        "learners": 0,
        "gpus_per_learner": -1,
        "cpus": 0,
        "memory_mb": 1,
        "env": {"A=B": "1"},
        "data": {"source": "s3://b/k", "sha256": "abc", "mount_path": "rel", "size": 1},
        "results": {"location": "https://r.example.org"},
        "checkpoint": {"interval_seconds": 0, "keep": 0},
        "max_restarts": -1,
        "priority": 1000,
        "labels": {"x": 1},
        "webhook_url": "nope",
        "gpu": 1,
    }
    assert set(errors_of(document)) == {
        ("name",),
        ("image",),
        ("command",),
        ("framework",),
        ("learners",),
        ("gpus_per_learner",),
        ("cpus",),
        ("memory_mb",),
        ("env", "A=B", "[key]"),
        ("data", "source"),
        ("data", "sha256"),
        ("data", "mount_path"),
        ("data", "size"),
        ("results", "location"),
        ("checkpoint", "interval_seconds"),
        ("checkpoint", "keep"),
        ("max_restarts",),
        ("priority",),
        ("labels", "x"),
        ("webhook_url",),
        ("gpu",),
    }


def test_missing_required_fields_are_all_reported() -> None:
    assert set(errors_of({})) == {("name",), ("image",), ("command",)}
    assert set(errors_of(manifest(data={}))) == {("data", "source")}
    assert set(errors_of(manifest(results={}))) == {("results", "location")}


# --- round trips -------------------------------------------------------------------------------

# Text a user may send that can be stored; the manifest refuses NUL (see above), and Hypothesis
# never draws unpaired surrogates unless asked.
text = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)
words = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=12)
paths = st.lists(st.from_regex(r"\A[A-Za-z0-9._-]{1,8}\Z"), min_size=1, max_size=3).map(
    lambda parts: "/" + "/".join(parts)
)
data_specs = st.builds(
    DataSpec,
    source=st.one_of(
        paths.map(lambda path: "file://" + path),
        st.tuples(st.sampled_from(["http", "https"]), paths).map(
            lambda parts: f"{parts[0]}://data.example.org{parts[1]}"
        ),
    ),
    sha256=st.none() | st.from_regex(r"\A[0-9a-f]{64}\Z"),
    mount_path=st.none() | paths,
)
manifests = st.builds(
    JobManifest,
    name=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,30}\Z"),
    image=words,
    command=st.lists(text, max_size=4).flatmap(lambda rest: words.map(lambda p: [p, *rest])),
    framework=st.sampled_from(["pytorch", "tensorflow", "jax", "horovod", "custom"]),
    learners=st.integers(1, 1024),
    gpus_per_learner=st.integers(0, 64),
    cpus=st.floats(min_value=MIN_CPUS, max_value=MAX_CPUS),
    memory_mb=st.integers(16, MAX_MEMORY_MB),
    restart_on=st.sampled_from(["any_failure", "infrastructure"]),
    env=st.dictionaries(
        words.filter(lambda name: "=" not in name and not reserved_env(name)), text, max_size=3
    ),
    data=st.none() | data_specs,
    results=st.none() | paths.map(lambda path: ResultsSpec(location="file://" + path)),
    checkpoint=st.builds(
        CheckpointSpec, interval_seconds=st.integers(1, 10**6), keep=st.integers(1, 100)
    ),
    max_restarts=st.integers(0, 100),
    priority=st.integers(-100, 100),
    labels=st.dictionaries(text, text, max_size=3),
    webhook_url=st.sampled_from(
        [None, "https://hooks.example.org/t?x=1", "http://10.0.0.1:8080/cb", "https://例え.jp/x"]
    ),
)


@settings(max_examples=200, deadline=None)
@given(manifests)
def test_a_manifest_survives_json_unchanged(job: JobManifest) -> None:
    text = job.model_dump_json()
    again = JobManifest.model_validate_json(text)
    assert again == job
    assert again.model_dump_json() == text
    # The HTTP layer validates a parsed body, not the raw text: the same must hold there.
    assert JobManifest.model_validate(json.loads(text)) == job


@settings(max_examples=100, deadline=None)
@given(manifests)
def test_a_manifest_survives_its_jobsubmitted_event(job: JobManifest) -> None:
    event = JobSubmitted(job_id=UUID(int=1), tenant="acme", manifest=job, at=datetime.now(UTC))
    decoded = EVENT_REGISTRY.decode(event.type_name, event.schema_version, event.model_dump_json())
    assert isinstance(decoded, JobSubmitted)
    assert decoded.manifest == job  # what idempotent resubmission compares against


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["image", "name", "first_arg", "env_value", "label"]),
        st.text(st.characters(codec="utf-8") | st.sampled_from(["\0", "\ud800", "\udfff"])),
    )
)
def test_whatever_text_is_accepted_can_be_stored(fields: dict[str, str]) -> None:
    document = manifest(
        image=fields.get("image", "img"),
        name=fields.get("name", "n"),
        command=["train", fields.get("first_arg", "")],
        env={"V": fields.get("env_value", "")},
        labels={"l": fields.get("label", "")},
    )
    try:
        job = JobManifest.model_validate(document)
    except ValidationError:
        return
    stored = job.model_dump_json()  # raises on text JSON cannot carry
    assert "\\u0000" not in stored  # which jsonb refuses
    assert JobManifest.model_validate_json(stored) == job


@pytest.mark.parametrize("version", [1, 2])
def test_a_jobsubmitted_event_from_before_the_floors_reads_within_them(version: int) -> None:
    """A job stored when `cpus` and timeouts had only to be > 0 (a subnormal `cpus` stopped
    every background worker): it still reads, its values raised to today's floors."""
    data = {
        "at": "2026-01-01T00:00:00Z",
        "job_id": str(UUID(int=7)),
        "tenant": "acme",
        "manifest": manifest(cpus=5e-324, deploy_timeout_s=1e-300),
    }
    decoded = EVENT_REGISTRY.decode("JobSubmitted", version, json.dumps(data))
    assert isinstance(decoded, JobSubmitted)
    assert (decoded.manifest.cpus, decoded.manifest.deploy_timeout_s) == (MIN_CPUS, MIN_TIMEOUT_S)
    submitted = JobSubmitted(
        job_id=UUID(int=7), tenant="acme", manifest=JobManifest(**MINIMAL), at=datetime.now(UTC)
    )
    stored = evolve(None, submitted).model_dump(mode="json")
    stored["manifest"]["cpus"] = 1e-320
    assert Job.model_validate_json(json.dumps(stored)).manifest.cpus == MIN_CPUS
