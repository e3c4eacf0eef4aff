"""Learner images: the operator's allowlist (TRAINYARD_IMAGES) refuses other images when a job is
submitted (422 naming `image`, nothing stored) and again on the node before a container is
created, where a pinned digest must be the node's copy; reserved environment names are refused
at submission (422 naming the variable)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import uuid4

import aiodocker
import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.http.app import create_app
from controlplane.jobs.images import (
    DEFAULT_ALLOWLIST,
    IMAGES_ENV,
    ImageAllowlist,
    ImageRef,
    ImageRefused,
)
from controlplane.jobs.lifecycle import JobStatus
from node_agent.docker_runtime import DockerRuntime
from node_agent.images import LEARNER_IMAGE, resolved_id
from node_agent.runtime import Folder, LearnerSpec, LearnerStartError
from tests.cluster import Plane, RunningAgent
from tests.docker_engine import Engine, containers_of, docker_agent_config
from tests.polling import eventually
from tests.tenancy import Tokens

Client = TestClient[Any, Any]
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


# --- the allowlist ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "image", ["trainyard-learner:latest", "trainyard-learner", f"trainyard-learner@{DIGEST_A}"]
)
def test_the_default_allows_the_learner_image(image: str) -> None:
    assert DEFAULT_ALLOWLIST.admit(image).image == image


@pytest.mark.parametrize(
    "image",
    ["trainyard-learner:2", "ubuntu", "evil/trainyard-learner:latest", "trainyard-learner-x"],
)
def test_the_default_refuses_every_other_image(image: str) -> None:
    with pytest.raises(ImageRefused, match=r"not allowed .*allowed: trainyard-learner:latest"):
        DEFAULT_ALLOWLIST.admit(image)


@pytest.mark.parametrize(
    ("allowed", "image", "admitted"),
    [
        # No tag in the entry: every tag of the repository.
        ("vision/resnet", "vision/resnet:2025.03", True),
        ("vision/resnet", "vision/resnet", True),
        ("vision/resnet", "vision/resnet-evil:1", False),
        # A tag: that tag only; an image without one is :latest.
        ("vision/resnet:1", "vision/resnet:1", True),
        ("vision/resnet:1", "vision/resnet:2", False),
        ("vision/resnet:latest", "vision/resnet", True),
        # Patterns.
        ("registry.example.org/vision/*", "registry.example.org/vision/resnet:3", True),
        ("registry.example.org/vision/*", "registry.example.org/nlp/bert:3", False),
        ("registry.example.org/vision/*", "evil.org/registry.example.org/vision/x", False),
        ("*:v?", "anything/at/all:v1", True),
        ("*:v?", "anything/at/all:latest", False),
        # A registry's port is not a tag.
        ("localhost:5000/team/x", "localhost:5000/team/x:7", True),
        ("localhost:5000/team/x", "localhost:5001/team/x:7", False),
        # Case matters, as it does to Docker.
        ("vision/resnet", "Vision/resnet", False),
        # Several entries.
        ("a, b:1 ,c/*", "b:1", True),
        ("a, b:1 ,c/*", "c/d:e", True),
        ("a, b:1 ,c/*", "b:2", False),
    ],
)
def test_names_tags_and_patterns(allowed: str, image: str, admitted: bool) -> None:
    allowlist = ImageAllowlist.parse(allowed)
    if admitted:
        assert allowlist.admit(image).digests == frozenset()
    else:
        with pytest.raises(ImageRefused, match=f"{image!r} is not allowed"):
            allowlist.admit(image)


def test_a_pinned_entry_names_the_digest_the_node_must_find() -> None:
    allowlist = ImageAllowlist.parse(f"team/x@{DIGEST_A},team/x@{DIGEST_B},other")
    assert allowlist.admit("team/x:7").digests == {DIGEST_A, DIGEST_B}
    assert allowlist.admit(f"team/x@{DIGEST_B}").digests == {DIGEST_B}
    assert allowlist.admit("other").digests == frozenset()
    with pytest.raises(ImageRefused, match="pinned to"):
        ImageAllowlist.parse(f"team/x@{DIGEST_A}").admit(f"team/x@{DIGEST_B}")
    # An unpinned entry for the same image admits it, digest or not.
    both = ImageAllowlist.parse(f"team/x@{DIGEST_A},team/*")
    assert both.admit("team/x").digests == frozenset()
    assert both.admit(f"team/x@{DIGEST_B}").digests == {DIGEST_B}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (" , ", "names no image"),
        ("x@sha256:abc", "64 lower-case hex"),
        ("x@md5:" + "a" * 32, "64 lower-case hex"),
        ("x:", "names no image"),
        (":tag", "names no image"),
    ],
)
def test_a_malformed_setting_is_refused_naming_the_variable(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"{IMAGES_ENV}: .*{says}"):
        ImageAllowlist.from_env({IMAGES_ENV: text})


def test_unset_or_empty_is_the_default() -> None:
    assert ImageAllowlist.from_env({}) == DEFAULT_ALLOWLIST
    assert ImageAllowlist.from_env({IMAGES_ENV: ""}) == DEFAULT_ALLOWLIST
    assert ImageRef.parse("a/b:c@" + DIGEST_A) == ImageRef("a/b", "c", DIGEST_A)


@pytest.mark.processes
@pytest.mark.parametrize(
    "command", [["serve", "--port", "1"], ["agent", "--runtime", "process", "--fake-gpus", "1"]]
)
def test_a_control_plane_or_agent_with_a_malformed_setting_does_not_start(
    tmp_path: Path, command: list[str]
) -> None:
    started = subprocess.run(
        [sys.executable, "-m", "cli", *command],
        env={"TRAINYARD_HOME": str(tmp_path), IMAGES_ENV: "x@sha256:1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 1
    assert f"{IMAGES_ENV}: 'x@sha256:1': a digest is" in started.stderr


# --- at submission ------------------------------------------------------------------------------


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    allowed = ImageAllowlist.parse(f"trainyard-learner:latest,team/*@{DIGEST_A}")
    app = create_app(db_url, poll_interval=0.2, images=allowed)
    async with TestClient(TestServer(app)) as client:
        yield client


async def post(client: Client, token: str, **changes: Any) -> tuple[int, dict[str, Any]]:
    manifest = {"name": "j", "image": "trainyard-learner:latest", "command": ["x"], **changes}
    response = await client.post(
        "/v1/jobs", json=manifest, headers={"Authorization": f"Bearer {token}"}
    )
    body: dict[str, Any] = await response.json()
    return response.status, body


async def jobs_in_log(owner: asyncpg.Connection) -> int:
    return int(await owner.fetchval("SELECT count(*) FROM events WHERE stream_id LIKE 'job-%'"))


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ("ubuntu:22.04", "'ubuntu:22.04' is not allowed"),
        ("trainyard-learner:other", "is not allowed"),
        (f"team/x@{DIGEST_B}", "pinned to " + DIGEST_A),
    ],
)
async def test_an_image_not_allowed_is_refused_with_422_naming_the_field(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, image: str, says: str
) -> None:
    status, body = await post(client, tokens.acme, image=image)
    assert (status, body["field"]) == (422, "image"), body
    assert says in body["error"]
    assert await jobs_in_log(owner) == 0
    status, body = await post(client, tokens.acme, image="team/x:1")
    assert status == 201, body


@pytest.mark.parametrize(
    "name", ["LD_PRELOAD", "PYTHONPATH", "TRAINYARD_EPOCH", "CUDA_VISIBLE_DEVICES", "PATH"]
)
async def test_a_reserved_environment_name_is_refused_with_422_naming_it(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, name: str
) -> None:
    status, body = await post(client, tokens.acme, env={"NCCL_DEBUG": "INFO", name: "x"})
    assert status == 422, body
    assert [f["field"] for f in body["fields"]] == [f"env.{name}"]
    assert f"{name} is reserved" in body["fields"][0]["message"]
    assert await jobs_in_log(owner) == 0


async def test_the_openapi_document_names_the_setting_and_the_reserved_names(
    client: Client,
) -> None:
    document = await (await client.get("/openapi.json")).json()
    text = json.dumps(document)
    assert IMAGES_ENV in text
    assert "LD_*" in text


# --- on the node --------------------------------------------------------------------------------


def test_a_pinned_image_must_be_the_node_s_copy() -> None:
    inspected = {"Id": DIGEST_A, "RepoDigests": [f"registry.example.org/x@{DIGEST_B}"]}
    assert resolved_id("x", frozenset(), inspected) == DIGEST_A
    assert resolved_id("x", frozenset({DIGEST_A}), inspected) == DIGEST_A
    assert resolved_id("x", frozenset({DIGEST_B}), inspected) == DIGEST_A
    other = "sha256:" + "c" * 64
    with pytest.raises(LearnerStartError, match=f"is {DIGEST_A}, not the digest .*{other}"):
        resolved_id("x", frozenset({other}), inspected)


LEARNER_UID = 200654


def learner(tmp_path: Path, node: str, image: str) -> LearnerSpec:
    return LearnerSpec(
        job_id=uuid4(),
        attempt=1,
        learner=0,
        epoch=1,
        node=node,
        image=image,
        command=["python3", "-c", "print('ran')"],
        env={},
        workdir=tmp_path / "work",
        gpus=[],
        cpus=1.0,
        memory_mb=256,
        user=(LEARNER_UID, LEARNER_UID),
        folders=[Folder(tmp_path, tmp_path / "work")],
    )


def image_id(image: str) -> str:
    return subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.mark.parametrize(
    ("allowed", "says"),
    [
        ("trainyard-test-*", f"{LEARNER_IMAGE!r} is not allowed .*{IMAGES_ENV} of this node"),
        (f"trainyard-learner@{DIGEST_A}", f"not the digest {IMAGES_ENV} pins \\({DIGEST_A}\\)"),
    ],
    ids=["not-allowed", "other-digest"],
)
async def test_the_node_refuses_an_image_its_allowlist_does_not_admit_and_creates_nothing(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path, allowed: str, says: str
) -> None:
    runtime = DockerRuntime(docker, images=ImageAllowlist.parse(allowed))
    with pytest.raises(LearnerStartError, match=says):
        await runtime.start(learner(tmp_path, docker_node, LEARNER_IMAGE))
    assert containers_of(docker_node) == []
    assert not (tmp_path / "work").exists()


async def test_the_node_runs_a_pinned_image_by_the_id_it_checked(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path
) -> None:
    pinned = image_id(LEARNER_IMAGE)
    runtime = DockerRuntime(docker, images=ImageAllowlist.parse(f"trainyard-learner@{pinned}"))
    started = await runtime.start(learner(tmp_path, docker_node, LEARNER_IMAGE))
    assert (await started.wait()).succeeded
    shown = await docker.containers.container(started.id).show()
    assert shown["Image"] == pinned
    await started.remove()


async def test_a_job_whose_image_the_node_refuses_fails_with_the_reason(
    plane: Plane, tmp_path: Path, docker_engine: Engine, docker_node: str
) -> None:
    config = replace(
        docker_agent_config(tmp_path, docker_engine, name=docker_node),
        images=ImageAllowlist.parse("trainyard-test-*"),
    )
    running = await RunningAgent(plane.url, config, fake_gpus=2).started()
    try:
        job_id = await plane.submit(["true"], image=LEARNER_IMAGE, deploy_retries=0)
        job = await plane.state(job_id, JobStatus.FAILED)
        assert job.failure_reason is not None
        assert "is not allowed" in job.failure_reason, job.failure_reason

        async def logged() -> bool:
            return any("is not allowed" in line for line in await plane.log_text(job_id))

        await eventually(logged)
        assert containers_of(docker_node) == []
    finally:
        await asyncio.wait_for(running.finish(), 60)
