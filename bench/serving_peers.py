"""The peers of `trainyard bench serving`: Ray Serve and BentoML serving the benchmark's MLP
(`bench.serving_model`) on this machine, measured by the same closed-loop clients
(`bench.closed_loop`) as Trainyard's own serving.

Each peer serves the very same `predict` (MLP_SOURCE, its weights seeded) with REPLICAS replicas
on the CPU, batching requests up to `max_batch_size` items. A request is JSON
`{"inputs": [item]}` (one item, as the clients send), POSTed to `/predict`; the answer holds that
item's 10 logits. Each `run_*` starts its peer, waits until it answers, runs the clients at each
concurrency in turn (WARMUP_S, then `duration_s` measured) and stops it; its result maps each
concurrency to `closed_loop`'s numbers. A peer that is not installed (the `bench` extra installs
both) is left out: None, and a line on stderr says so.

Ray Serve. A local Ray instance with REPLICAS CPUs (`ray.init(num_cpus=...)`, no dashboard),
Serve's HTTP proxy on a free localhost port, and a deployment of REPLICAS replicas (one CPU
each) that execs MLP_SOURCE and batches with `serve.batch(max_batch_size,
batch_wait_timeout_s=max_wait_ms / 1000)`: a batch leaves when it is full or its first request
has waited `max_wait_ms`, as Trainyard's do. A replica admits `2 * max_batch_size` requests at a
time (`max_ongoing_requests`): Serve's default, 5, would cap its batches below `max_batch_size`
(Serve warns of it), and twice a batch lets the next batch gather while one runs. The endpoint
answers `{"outputs": [logits]}`. Afterwards `serve.shutdown()` and `ray.shutdown()`.

BentoML. `bentoml serve` in a child process (a session of its own, so that its worker
processes go with it) on a free localhost port, from a service file written next to `mlp.py`
(MLP_SOURCE) in a temporary folder: `@bentoml.service(workers=REPLICAS)`, one API
`@bentoml.api(batchable=True, max_batch_size=..., max_latency_ms=...)` whose batch is the list
of items. Its answer is the bare list of that request's outputs, `[logits]`: a batchable API's
return value is the batch that BentoML splits back among the requests, so it cannot be wrapped
in an object. BentoML has no batch window to set: its dispatcher learns how long a batch takes
and decides by itself how long to let one gather (adaptive batching). Its `max_latency_ms` is a
deadline, not a window: a request whose wait plus the expected batch time would pass it is
refused with a 503. Given `max_wait_ms` there, BentoML refuses a large share of the requests
once the clients outnumber its workers (most of them wait longer than a few milliseconds for
their turn on a loaded machine), measuring its refusals, not its serving; so it gets
BENTOML_MAX_LATENCY_MS, a deadline no answer of a working server reaches, and the clients' own
timeout stays the limit, as it is for the others. `max_wait_ms` does not apply to BentoML.
Terminated with SIGTERM to its process group, then SIGKILL to whatever of the group is left.
Usage tracking is off in both (the benchmark sends nothing off the machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from bench.closed_loop import REQUEST_TIMEOUT_S, closed_loop
from bench.serving_model import MLP_SOURCE, sample_input

REPLICAS = 2
WARMUP_S = 2.0
"""Before each concurrency's measured window: connections opened, batching settled (BentoML's
dispatcher trains on its first batches)."""
READY_TIMEOUT_S = 180.0
"""For a peer to start and answer its first request (Ray starts a cluster; both import torch)."""
STOP_TIMEOUT_S = 30.0
BENTOML_MAX_LATENCY_MS = int(REQUEST_TIMEOUT_S * 1000)
"""BentoML's deadline for a request (see the module's docstring): the clients' timeout."""
OUTPUTS = 10
"""Logits per item."""

BENTOML_SERVICE = '''\
"""`trainyard bench serving`'s MLP as a BentoML service (`bentoml serve service:MLP`)."""

import bentoml
from pydantic import BaseModel

import mlp


class Settings(BaseModel):
    workers: int
    max_batch_size: int
    max_latency_ms: int


settings = bentoml.use_arguments(Settings)


@bentoml.service(workers=settings.workers)
class MLP:
    @bentoml.api(
        batchable=True,
        max_batch_size=settings.max_batch_size,
        max_latency_ms=settings.max_latency_ms,
    )
    def predict(self, inputs: list[list[float]]) -> list[list[float]]:
        return mlp.predict(inputs)
'''

Sender = Callable[[aiohttp.ClientSession], Awaitable[None]]
Results = dict[int, dict[str, float]]


async def run_ray_serve(
    concurrencies: Sequence[int], *, max_batch_size: int, max_wait_ms: float, duration_s: float
) -> dict[int, dict[str, float]] | None:
    """Ray Serve's numbers at each concurrency; None when Ray Serve is not installed."""
    try:
        import ray
        from ray import serve
    except ImportError as missing:
        _note(f"serving: Ray Serve left out ({missing}; install the `bench` extra)")
        return None
    # Read when Ray starts; the benchmark reports nothing to Ray's servers.
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    port = _free_port()
    deployment = serve.deployment(
        num_replicas=REPLICAS,
        ray_actor_options={"num_cpus": 1},
        max_ongoing_requests=2 * max_batch_size,
    )(_RayMLP)
    app = deployment.bind(MLP_SOURCE, max_batch_size, max_wait_ms / 1000)

    def start() -> None:
        ray.init(num_cpus=REPLICAS, include_dashboard=False, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(app, route_prefix="/predict")

    def stop() -> None:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()

    url = f"http://127.0.0.1:{port}/predict"
    try:
        # Ray's calls block for seconds: off the event loop.
        await asyncio.to_thread(start)
        await _until_answers(url, _outputs_of_object)
        return await _measure(url, _outputs_of_object, concurrencies, duration_s)
    finally:
        await asyncio.to_thread(stop)


async def run_bentoml(
    concurrencies: Sequence[int], *, max_batch_size: int, max_wait_ms: float, duration_s: float
) -> dict[int, dict[str, float]] | None:
    """BentoML's numbers at each concurrency; None when BentoML is not installed.
    `max_wait_ms` does not apply: BentoML's batch window is its own (see the module's
    docstring)."""
    try:
        import bentoml
    except ImportError as missing:
        _note(f"serving: BentoML left out ({missing}; install the `bench` extra)")
        return None
    _note(
        f"serving: BentoML {bentoml.__version__} sets its own batch window "
        f"(max_wait_ms {max_wait_ms} does not apply; deadline {BENTOML_MAX_LATENCY_MS} ms)"
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}/predict"
    with tempfile.TemporaryDirectory(prefix="bench-bentoml-") as home:
        folder = Path(home)
        (folder / "mlp.py").write_text(MLP_SOURCE)
        (folder / "service.py").write_text(BENTOML_SERVICE)
        log_path = folder / "bentoml.log"
        settings = {
            "workers": REPLICAS,
            "max_batch_size": max_batch_size,
            "max_latency_ms": BENTOML_MAX_LATENCY_MS,
        }
        arguments = [f"--arg={name}={value}" for name, value in settings.items()]
        with log_path.open("wb") as log:
            server = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bentoml",
                "serve",
                "service:MLP",
                "--host=127.0.0.1",
                f"--port={port}",
                f"--working-dir={folder}",
                *arguments,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "BENTOML_DO_NOT_TRACK": "true"},
                # Its own process group: its workers are stopped with it.
                start_new_session=True,
            )
        try:
            try:
                await _until_answers(url, _outputs_of_list, alive=lambda: server.returncode is None)
            except RuntimeError as failure:
                raise RuntimeError(f"{failure}; its log:\n{_tail(log_path)}") from failure
            return await _measure(url, _outputs_of_list, concurrencies, duration_s)
        finally:
            await _stop_group(server)


class _JSONRequest(Protocol):
    async def json(self) -> Any: ...


class _RayMLP:
    """Ray Serve's replica: MLP_SOURCE exec'd (the source travels with the deployment, so the
    replica needs no file of it), its `predict` behind `serve.batch`."""

    def __init__(self, source: str, max_batch_size: int, batch_wait_timeout_s: float) -> None:
        from ray import serve

        namespace: dict[str, Any] = {}
        exec(compile(source, "mlp.py", "exec"), namespace)
        predict: Callable[[list[list[float]]], list[list[float]]] = namespace["predict"]

        async def infer(batch: list[list[float]]) -> list[list[float]]:
            return predict(batch)

        self._infer = serve.batch(
            max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s
        )(infer)

    async def __call__(self, request: _JSONRequest) -> dict[str, list[list[float]]]:
        body = await request.json()
        outputs = await asyncio.gather(*(self._infer(item) for item in body["inputs"]))
        return {"outputs": list(outputs)}


async def _measure(
    url: str, outputs_of: Callable[[Any], Any], concurrencies: Sequence[int], duration_s: float
) -> Results:
    send = _sender(url, outputs_of)
    results: Results = {}
    for concurrency in concurrencies:
        results[concurrency] = await closed_loop(send, concurrency, duration_s, WARMUP_S)
    return results


def _sender(url: str, outputs_of: Callable[[Any], Any]) -> Sender:
    """One request of one item; the answer checked to hold that item's logits."""
    body = json.dumps({"inputs": [sample_input()]}).encode()
    headers = {"Content-Type": "application/json"}

    async def send(session: aiohttp.ClientSession) -> None:
        async with session.post(url, data=body, headers=headers) as response:
            response.raise_for_status()
            answer = await response.json()
        outputs = outputs_of(answer)
        if not (isinstance(outputs, list) and len(outputs) == 1 and len(outputs[0]) == OUTPUTS):
            raise ValueError(f"{url} answered {str(answer)[:200]}, not one item's {OUTPUTS} logits")

    return send


def _outputs_of_object(answer: Any) -> Any:
    return answer.get("outputs") if isinstance(answer, dict) else None


def _outputs_of_list(answer: Any) -> Any:
    return answer


async def _until_answers(
    url: str, outputs_of: Callable[[Any], Any], alive: Callable[[], bool] | None = None
) -> None:
    """Until a request is answered right; RuntimeError when the server dies (`alive`, where
    the server is a process of ours, says it no longer is) or READY_TIMEOUT_S passes first."""
    send = _sender(url, outputs_of)
    deadline = time.monotonic() + READY_TIMEOUT_S
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            if alive is not None and not alive():
                raise RuntimeError(f"the server behind {url} exited before answering")
            try:
                await send(session)
                return
            except (aiohttp.ClientError, TimeoutError) as failure:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{url} did not answer within {READY_TIMEOUT_S} s: {failure}"
                    ) from failure
            await asyncio.sleep(0.5)


async def _stop_group(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the process's group (it leads one: `start_new_session`), a wait for it to
    exit, then SIGKILL to whatever of the group is still there (a worker that outlived it)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
    except TimeoutError:
        _note(f"serving: the server (pid {process.pid}) ignored SIGTERM; killed")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _note(what: str) -> None:
    print(what, file=sys.stderr)
