"""Canaries from the CLI and the SDK, against a stub server: what each flag sends (only the
settings given), the usage errors before anything is sent, and the deployment shown with its
split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.trainyard.test_models_cli import user
from trainyard.serving_commands import deployment_text

VIEW: dict[str, Any] = {
    "name": "dbl",
    "model": "acme/double:1",
    "reference": "double:1",
    "version": 1,
    "artifact_sha256": "1" * 64,
    "entry_point": "double:predict",
    "state": "serving",
    "replicas": 1,
    "autoscaling": None,
    "resources": {"gpus": 0, "cpus": 1.0, "memory_mb": 2048, "image": "img"},
    "serving": {
        "max_batch_size": 8,
        "max_wait_ms": 5.0,
        "memo": True,
        "memo_max_entries": 10,
        "task_timeout_s": 30.0,
    },
    "replica_jobs": [{"job_id": "own-job", "state": "PROCESSING", "attempt": 1}],
    "created_at": "2026-11-29T08:00:00Z",
    "updated_at": "2026-11-29T08:00:00Z",
    "canary": {
        "model": "acme/double:2",
        "reference": "double:2",
        "version": 2,
        "artifact_sha256": "2" * 64,
        "weight": 10,
        "replicas": 1,
        "rollback": {"max_error_rate": 0.05, "min_requests": 20, "window_s": 60.0},
        "replica_jobs": [{"job_id": "canary-job", "state": "QUEUED", "attempt": 1}],
        "started_at": "2026-11-29T08:01:00Z",
    },
}


async def test_a_canary_is_started_moved_promoted_and_rolled_back_from_the_cli(
    tmp_path: Path,
) -> None:
    sent: list[tuple[str, Any]] = []

    async def put(request: web.Request) -> web.Response:
        sent.append(("PUT", await request.json()))
        return web.json_response(VIEW)

    async def promote(request: web.Request) -> web.Response:
        sent.append(("POST", None))
        return web.json_response(VIEW)

    async def delete(request: web.Request) -> web.Response:
        sent.append(("DELETE", None))
        return web.json_response(VIEW)

    path = "/v1/deployments/dbl/canary"
    app = web.Application()
    app.add_routes(
        [web.put(path, put), web.post(f"{path}/promote", promote), web.delete(path, delete)]
    )
    async with TestServer(app) as server:
        cli = user(tmp_path, str(server.make_url("")), "t")
        started = await cli(
            "deployments",
            "dbl",
            "--canary",
            "double:2",
            "--weight",
            "10",
            "--canary-replicas",
            "2",
            "--auto-rollback",
            "0.05:20",
        )
        assert started.rc == 0, started.stderr
        assert "acme/double:2 taking 10% of requests" in started.stdout
        moved = await cli("deployments", "dbl", "--canary", "double:2", "--weight", "50")
        assert moved.rc == 0, moved.stderr
        assert (await cli("deployments", "dbl", "--promote", "--output", "json")).rc == 0
        assert (await cli("deployments", "dbl", "--rollback", "--output", "json")).rc == 0
        # Refused before anything is sent: each says what is missing.
        for args, words in (
            (("--canary", "double:2"), "--weight"),
            (("--weight", "5"), "--canary"),
            (("--canary", "double:2", "--weight", "5", "--auto-rollback", "x"), "RATE"),
            (("--promote", "--rollback"), "not allowed"),
        ):
            refused = await cli("deployments", "dbl", *args)
            assert refused.rc == 2 and words in refused.stderr, (args, refused.stderr)
        assert (await cli("deployments", "--promote")).rc == 2  # needs NAME
    assert sent == [
        (
            "PUT",
            {
                "model": "double:2",
                "weight": 10,
                "replicas": 2,
                "rollback": {"max_error_rate": 0.05, "min_requests": 20},
            },
        ),
        ("PUT", {"model": "double:2", "weight": 50}),
        ("POST", None),
        ("DELETE", None),
    ]


def test_the_deployment_shows_its_split_and_each_versions_replicas() -> None:
    text = deployment_text(VIEW)
    assert "acme/double:2 taking 10% of requests on 1 replica(s)" in text
    assert "past 0.05 failed, of at least 20 requests in 60 s" in text
    rows = [line.split() for line in text.splitlines() if line.endswith("job") or "-job" in line]
    assert ["own-job", "1", "PROCESSING", "1"] in rows
    assert ["canary-job", "2", "QUEUED", "1"] in rows
    without = deployment_text({**VIEW, "canary": None})
    assert "canary" not in without
