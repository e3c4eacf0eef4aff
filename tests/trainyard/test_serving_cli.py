"""Model serving as a user runs it: `trainyard deploy | predict | task | deployments | pipelines |
undeploy` subprocesses against the control plane's app on a real Postgres, with a real agent
whose replicas run the tenant's model; the SDK's calls against it too; and how the SDK waits for
a task when the task's stream is refused or breaks off, against stub servers."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from controlplane.deployments.spec import DeploymentRequest
from tests.controlplane.deployments.serving import publish, serving_cluster
from tests.tenancy import Tokens
from tests.trainyard.test_client_cli import Cli, Result
from tests.trainyard.test_models_cli import user
from trainyard import AsyncClient, Client, UsageError
from trainyard import client as client_module

DOUBLE = b"def predict(batch):\n    return [x * 2 for x in batch]\n"
FAILING = b"def predict(batch):\n    return [1 / (x - x) for x in batch]\n"
TASK = str(uuid.uuid4())


@pytest.fixture
async def cluster(db_url: str, tmp_path: Path, tokens: Tokens) -> AsyncIterator[Cli]:
    """`trainyard` as tenant acme, whose models `double` and `failing` are published, against
    the app of a serving cluster (its URL: the Cli's TRAINYARD_SERVER)."""
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await publish(client, tokens.acme, "failing", FAILING, "failing:predict")
        yield user(tmp_path, str(client.make_url("")), tokens.acme)


async def piped(cli: Cli, stdin: str, *args: str) -> Result:
    """`trainyard ARGS` with `stdin` on its standard input."""
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "cli", *args),
        env=cli.env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin.encode()), 60)
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())


@pytest.mark.processes
async def test_a_model_is_deployed_run_scaled_chained_and_undeployed(
    cluster: Cli, tmp_path: Path
) -> None:
    cli = cluster
    deployed = await cli("deploy", "dbl", "--model", "double", "--max-batch-size", "4")
    assert deployed.rc == 0, deployed.stderr
    assert deployed.stdout == "dbl serves acme/double:1 on 1 replica(s)\n"

    # At once: the task waits in the queue for the replica to start.
    ran = await cli("predict", "dbl", "[1,2]")
    assert (ran.rc, ran.stdout) == (0, "[2, 4]\n"), ran.stderr
    items = tmp_path / "items.json"
    items.write_text("[5]")
    task = (await cli("predict", "dbl", f"@{items}", "--output", "json")).json()
    assert (task["status"], task["outputs"], task["memo"]) == ("succeeded", [10], "miss")
    assert (await piped(cli, "[7]", "predict", "dbl", "-")).stdout == "[14]\n"

    queued = await cli("predict", "dbl", "[3]", "--async")
    assert queued.rc == 0, queued.stderr
    task_id = queued.stdout.strip()
    waited = await cli("task", task_id, "--wait")
    assert waited.rc == 0, waited.stderr
    assert "succeeded" in waited.stdout and "outputs: [6]" in waited.stdout
    shown = (await cli("task", task_id, "--output", "json")).json()
    assert (shown["status"], shown["outputs"], shown["deployment"]) == ("succeeded", [6], "dbl")
    # Finished: nothing left to cancel (the server's reason, exit code 1).
    late = await cli("task", task_id, "--cancel")
    assert late.rc == 1 and "already succeeded" in late.stderr, late.stderr
    assert (await cli("task", task_id, "--wait", "--cancel")).rc == 2

    for bad, message in (
        ('{"items": [1]}', "INPUT is a JSON array of items, e.g. '[1, 2]', not an object"),
        ("[1,", "INPUT: not JSON (line 1 column 4"),
        (f"@{tmp_path / 'missing.json'}", "cannot read"),
    ):
        refused = await cli("predict", "dbl", bad)
        assert refused.rc == 2 and message in refused.stderr, refused.stderr
        assert refused.stdout == ""
    # More items than a batch: the task runs in several calls.
    assert (await cli("predict", "dbl", "[1,2,3,4,5]")).stdout == "[2, 4, 6, 8, 10]\n"

    listed = await cli("deployments")
    assert "dbl" in listed.stdout and "acme/double:1" in listed.stdout, listed.stderr
    text = (await cli("deployments", "dbl")).stdout
    assert "double:predict" in text and "up to 4 items" in text
    scaled = (await cli("deployments", "dbl", "--scale", "2", "--output", "json")).json()
    assert scaled["replicas"] == 2
    figures = (await cli("deployments", "dbl", "--metrics", "--output", "json")).json()
    assert figures["succeeded"] >= 4 and figures["failed"] == 0
    assert "requests" in (await cli("deployments", "dbl", "--metrics")).stdout
    alone = await cli("deployments", "--metrics")
    assert alone.rc == 2 and "need a deployment's NAME" in alone.stderr

    defined = await cli("pipelines", "define", "quad", "dbl", "dbl")
    assert defined.stdout == "pipeline quad: dbl -> dbl\n", defined.stderr
    chained = await cli("predict", "quad", "[1]", "--pipeline")
    assert (chained.rc, chained.stdout) == (0, "[4]\n"), chained.stderr
    assert "dbl -> dbl" in (await cli("pipelines", "show", "quad")).stdout
    assert (await cli("pipelines", "rm", "quad")).rc == 0
    assert (await cli("pipelines", "show", "quad")).rc == 4

    undeployed = await cli("undeploy", "dbl")
    assert undeployed.stdout == "dbl deleting\n", undeployed.stderr
    assert (await cli("predict", "dbl", "[1]")).rc == 4


@pytest.mark.processes
async def test_a_failed_task_is_exit_code_1_with_its_error_on_standard_error(
    cluster: Cli,
) -> None:
    cli = cluster
    assert (await cli("deploy", "bad", "--model", "failing", "--no-memo")).rc == 0
    failed = await cli("predict", "bad", "[1]")
    assert failed.rc == 1 and failed.stdout == ""
    assert "failed:" in failed.stderr and "ZeroDivisionError" in failed.stderr
    task_id = (await cli("predict", "bad", "[2]", "--async")).stdout.strip()
    waited = await cli("task", task_id, "--wait")
    assert waited.rc == 1 and "ZeroDivisionError" in waited.stdout
    # Only waiting judges the task; showing it is a success.
    assert (await cli("task", task_id)).rc == 0


async def test_the_sdk_deploys_predicts_and_waits_as_a_tenant_and_as_the_admin(
    db_url: str, tmp_path: Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reading the task is for a stream that fails: here the stream itself must say when.
    monkeypatch.setattr(client_module, "TASK_POLL_S", (600.0,))
    async with serving_cluster(db_url, tmp_path) as (cluster, _):
        await publish(cluster, tokens.acme, "double", DOUBLE, "double:predict")
        server = str(cluster.make_url(""))
        async with (
            AsyncClient(server, tokens.acme) as acme,
            AsyncClient(server, tokens.admin) as admin,
        ):
            view = await admin.deploy("dbl", "double", max_wait_ms=0, tenant="acme")
            assert (view["tenant"], view["model"]) == ("acme", "acme/double:1")
            task = await acme.predict("dbl", [1, 2, 3])
            assert (task["status"], task["outputs"]) == ("succeeded", [2, 4, 6])
            queued = await acme.predict("dbl", [4], asynchronous=True, no_cache=True)
            done = await acme.wait_task(queued["task_id"], timeout_s=30)
            assert (done["status"], done["outputs"]) == ("succeeded", [8])
            assert (await admin.task(queued["task_id"], tenant="acme"))["outputs"] == [8]
            listed = await admin.deployments(tenant="acme")
            assert [item["name"] for item in listed] == ["dbl"]
            assert (await acme.deployment_metrics("dbl"))["succeeded"] == 2
            # The blocking client, in a thread: this one's loop runs the server.
            with Client(server, tokens.acme) as blocking:
                task = await asyncio.to_thread(blocking.predict, "dbl", [5])
                assert task["outputs"] == [10]
                shown = await asyncio.to_thread(blocking.deployment, "dbl")
                assert shown["replicas"] == 1
            assert (await acme.undeploy("dbl"))["state"] == "deleting"


async def test_names_and_task_ids_are_checked_before_anything_is_sent() -> None:
    # No server: a request would be ServerUnreachable.
    async with AsyncClient("http://127.0.0.1:9", "t") as client:
        with pytest.raises(UsageError, match=r"invalid name '\.\./jobs'"):
            await client.deployment("../jobs")
        with pytest.raises(UsageError, match="invalid name 'Quad'"):
            await client.predict("Quad", [1], pipeline=True)
        with pytest.raises(UsageError, match="a task id is a UUID"):
            await client.wait_task("42")


async def test_a_deploy_without_settings_gets_the_server_s_defaults(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    # No agent: what the deployment asks for is stored, and shown, before any replica runs.
    async with serving_cluster(db_url, tmp_path, agents=0) as (cluster, _):
        await publish(cluster, tokens.acme, "double", DOUBLE, "double:predict")
        server = str(cluster.make_url(""))
        request = DeploymentRequest(name="dbl", model="double")
        async with AsyncClient(server, tokens.acme) as acme:
            plain = await acme.deploy("dbl", "double")
            assert plain["replicas"] == request.replicas
            assert plain["resources"] == request.resources.model_dump()
            assert plain["serving"] == request.serving.model_dump()
            # What is given is the caller's, and the rest still the server's; through the
            # blocking client too (in a thread: this loop runs the server).
            with Client(server, tokens.acme) as blocking:
                tuned = await asyncio.to_thread(
                    blocking.deploy, "tuned", "double", cpus=0.5, max_batch_size=4, memo=False
                )
            assert tuned["resources"] == {**request.resources.model_dump(), "cpus": 0.5}
            changed = {"max_batch_size": 4, "memo": False}
            assert tuned["serving"] == {**request.serving.model_dump(), **changed}
            assert (await acme.deployment("tuned"))["serving"] == tuned["serving"]


@pytest.mark.processes
async def test_the_sdk_and_the_cli_send_only_the_settings_given(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    async def deploy(request: web.Request) -> web.Response:
        body = await request.json()
        sent.append(body)
        view = {"name": body["name"], "model": "acme/double:1", "replicas": 1}
        return web.json_response(view, status=201)

    async with await _stub([web.post("/v1/deployments", deploy)]) as server:
        url = str(server.make_url(""))
        async with AsyncClient(url, "t") as client:
            await client.deploy("plain", "double")
            await client.deploy("some", "double", replicas=0, gpus=1, max_wait_ms=0, memo=True)
        cli = user(tmp_path, url, "t")
        assert (await cli("deploy", "cli", "--model", "double")).rc == 0
        flags = ("--memory-mb", "4096", "--task-timeout", "5", "--no-memo")
        assert (await cli("deploy", "flags", "--model", "double", *flags)).rc == 0
        scaled = ("--min-replicas", "0", "--max-replicas", "4", "--target-in-flight", "2")
        assert (await cli("deploy", "auto", "--model", "double", *scaled)).rc == 0
    nothing: dict[str, Any] = {"resources": {}, "serving": {}}
    assert sent == [
        {"name": "plain", "model": "double", **nothing},
        {
            "name": "some",
            "model": "double",
            "replicas": 0,
            "resources": {"gpus": 1},
            "serving": {"max_wait_ms": 0, "memo": True},
        },
        {"name": "cli", "model": "double", **nothing},
        {
            "name": "flags",
            "model": "double",
            "resources": {"memory_mb": 4096},
            "serving": {"task_timeout_s": 5.0, "memo": False},
        },
        {
            "name": "auto",
            "model": "double",
            **nothing,
            "autoscaling": {"min_replicas": 0, "max_replicas": 4, "target_in_flight": 2.0},
        },
    ]


@pytest.mark.processes
async def test_autoscaling_is_turned_on_changed_and_off_from_the_cli(tmp_path: Path) -> None:
    sent: list[tuple[str, Any]] = []

    async def put(request: web.Request) -> web.Response:
        sent.append(("PUT", await request.json()))
        return web.json_response({"name": "dbl", "autoscaling": await request.json()})

    async def delete(request: web.Request) -> web.Response:
        sent.append(("DELETE", None))
        return web.json_response({"name": "dbl", "autoscaling": None})

    path = "/v1/deployments/dbl/autoscaling"
    async with await _stub([web.put(path, put), web.delete(path, delete)]) as server:
        cli = user(tmp_path, str(server.make_url("")), "t")
        for bounds in ("0:4", "1:8:2.5:30"):
            done = await cli("deployments", "dbl", "--autoscale", bounds, "--output", "json")
            assert done.rc == 0, done.stderr
        assert (await cli("deployments", "dbl", "--no-autoscale", "--output", "json")).rc == 0
        bad = await cli("deployments", "dbl", "--autoscale", "4")
        assert bad.rc == 2 and "MIN:MAX" in bad.stderr
        assert (await cli("deployments", "--no-autoscale")).rc == 2  # needs NAME
    assert sent == [
        ("PUT", {"min_replicas": 0, "max_replicas": 4}),
        (
            "PUT",
            {
                "min_replicas": 1,
                "max_replicas": 8,
                "target_in_flight": 2.5,
                "scale_down_delay_s": 30.0,
            },
        ),
        ("DELETE", None),
    ]


def _task(status: str, **extra: Any) -> dict[str, Any]:
    return {"task_id": TASK, "status": status, "items": 1, **extra}


async def _stub(routes: list[web.RouteDef]) -> TestServer:
    app = web.Application()
    app.add_routes(routes)
    return TestServer(app)


async def test_a_synchronous_predict_answered_202_waits_for_its_task_by_reading_it() -> None:
    """The server stopped waiting (202), and the task's stream is refused (429, the tenant's
    streams at their limit): the SDK reads the task until it has finished."""
    sent: list[dict[str, Any]] = []
    reads = 0

    async def predict(request: web.Request) -> web.Response:
        sent.append(await request.json())
        return web.json_response(_task("queued"), status=202)

    async def events(request: web.Request) -> web.Response:
        return web.json_response({"error": "too many live streams"}, status=429)

    async def task(request: web.Request) -> web.Response:
        nonlocal reads
        reads += 1
        return web.json_response(_task("succeeded", outputs=[2]) if reads > 2 else _task("running"))

    routes = [
        web.post("/v1/deployments/dbl/predict", predict),
        web.get(f"/v1/tasks/{TASK}/events", events),
        web.get(f"/v1/tasks/{TASK}", task),
    ]
    async with await _stub(routes) as server, AsyncClient(str(server.make_url("")), "t") as client:
        done = await client.predict("dbl", [1])
    assert (done["status"], done["outputs"], reads) == ("succeeded", [2], 3)
    assert sent == [{"inputs": [1], "async": False, "no_cache": False}]


async def test_a_stream_that_ends_before_the_task_is_followed_by_reading_it() -> None:
    reads = 0

    async def events(request: web.Request) -> web.StreamResponse:
        # A replica shutting down ends its streams early: the task goes on.
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"event: status\ndata: {json.dumps(_task('running'))}".encode())
        await response.write(b"\n\n: heartbeat\n\n")
        await response.write_eof()
        return response

    async def task(request: web.Request) -> web.Response:
        nonlocal reads
        reads += 1
        return web.json_response(_task("failed", error="ZeroDivisionError"))

    routes = [web.get(f"/v1/tasks/{TASK}/events", events), web.get(f"/v1/tasks/{TASK}", task)]
    async with await _stub(routes) as server, AsyncClient(str(server.make_url("")), "t") as client:
        done = await client.wait_task(TASK)
    assert (done["status"], done["error"], reads) == ("failed", "ZeroDivisionError", 1)


async def test_waiting_for_a_task_gives_up_after_its_timeout() -> None:
    async def events(request: web.Request) -> web.Response:
        return web.json_response({"error": "too many live streams"}, status=429)

    async def task(request: web.Request) -> web.Response:
        return web.json_response(_task("running"))

    routes = [web.get(f"/v1/tasks/{TASK}/events", events), web.get(f"/v1/tasks/{TASK}", task)]
    async with await _stub(routes) as server, AsyncClient(str(server.make_url("")), "t") as client:
        with pytest.raises(TimeoutError):
            await client.wait_task(TASK, timeout_s=0.3)
