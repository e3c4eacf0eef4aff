"""`python -m bench.gpu_check`: what a GPU machine shows of the agent's real GPU path, as JSON.

Run where a GPU is (it proves nothing elsewhere):
- inventory: the GPUs the agent's NVML inventory offers (index, UUID, model, memory, health),
  and its utilization reading;
- pinning: a learner's environment as the agent builds it (`learner_env`) for each GPU, run as
  a child process that asks CUDA what it sees: exactly that GPU (its UUID matched through
  torch), and with no GPU given, none at all;
- docker: whether an engine answers here (the Docker runtime's pinning needs one);
- inference: the serving benchmark's MLP run directly on the GPU (no Trainyard), items per
  second at batch sizes 1, 8 and 32: the ceiling a replica on this GPU can approach;
- replica: the same MLP as a deployment's replica runs it (`runners.serve`, pinned to the GPU
  by the agent's environment, loaded and fed by the agent's client over its socket), items
  per second and each call's p50 at the same batch sizes: what serving adds on the replica's
  side (the queue in Postgres comes on top, see `trainyard bench serving`);
- vision: inference jobs' queries (16 generated 3x224x224 images each) of ResNet18 and AlexNet
  on the GPU, run directly and by a replica pinned to it: queries per second, and the load;
- distributed: the DDP digits example (`runners.examples.digits_ddp`) as a one-rank NCCL process
  group on the GPU (env:// on 127.0.0.1) against the same run on the CPU with gloo (the weights'
  max abs difference, reported against a stated tolerance, not asserted), NCCL's version, and two
  ranks with gloo on CUDA tensors on the one GPU. Skipped, saying why, where there is no GPU.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.serving_model import MLP_ENTRY_POINT, MLP_SOURCE, mlp_artifact, sample_input
from node_agent.inventory import open_inventory
from node_agent.replica_client import ReplicaClient
from node_agent.runtime import LearnerSpec, learner_env
from runners.config import SERVE_DIR

BATCH = 16
"""Images in an inference query, as in IDunno's experiment."""

SEES = (
    "import json, torch\n"
    "n = torch.cuda.device_count()\n"
    "print(json.dumps({'count': n, 'uuids': ["
    "'GPU-' + str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]}))\n"
)


def inventory() -> list[dict[str, Any]]:
    found = open_inventory(None, "gpu-check", logging.getLogger("gpu-check"))
    utilization = found.utilization()
    return [
        {
            "index": gpu.index,
            "uuid": gpu.uuid,
            "model": gpu.model,
            "memory_mb": gpu.memory_mb,
            "healthy": gpu.healthy,
            "utilization_pct": utilization.get(gpu.uuid),
        }
        for gpu in found.gpus()
    ]


def _spec(gpus: list[str]) -> LearnerSpec:
    return LearnerSpec(
        job_id=uuid.uuid4(),
        attempt=1,
        learner=0,
        epoch=1,
        node="gpu-check",
        image="",
        command=[],
        env={},
        workdir=Path("/tmp"),
        gpus=gpus,
        cpus=1,
        memory_mb=1024,
    )


def seen_with(gpus: list[str]) -> dict[str, Any]:
    """What a learner given `gpus` sees, with the environment the agent gives it."""
    env = learner_env(_spec(gpus), path="/usr/bin:/bin")
    done = subprocess.run(
        [sys.executable, "-c", SEES], env=env, capture_output=True, text=True, check=True
    )
    seen: dict[str, Any] = json.loads(done.stdout)
    return seen


def pinning(uuids: list[str]) -> dict[str, Any]:
    each = {}
    for gpu in uuids:
        seen = seen_with([gpu])
        each[gpu] = {**seen, "only_its_own": seen["uuids"] == [gpu]}
    nothing = seen_with([])
    return {"each": each, "none_given": nothing, "none_seen": nothing["count"] == 0}


def inference(batch_sizes: tuple[int, ...] = (1, 8, 32), seconds: float = 3.0) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(MLP_SOURCE, "mlp.py", "exec"), namespace)  # the servable's own module
    import torch

    model = namespace["MODEL"].to("cuda")
    rates = {}
    for size in batch_sizes:
        batch = torch.tensor([sample_input(n) for n in range(size)], device="cuda")
        with torch.inference_mode():
            model(batch).tolist()  # warm up (kernels chosen, memory taken)
            calls, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                model(batch).tolist()  # back to Python, as a replica answers
                calls += 1
        rates[str(size)] = round(calls * size / (time.perf_counter() - started), 1)
    return {"items_per_s": rates, "device": torch.cuda.get_device_name(0)}


async def replica(
    gpu: str, batch_sizes: tuple[int, ...] = (1, 8, 32), seconds: float = 3.0
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="trainyard-gpu-check-") as work:
        serve_dir = Path(work)
        artifact = serve_dir / "mlp.zip"
        artifact.write_bytes(mlp_artifact())
        env = learner_env(_spec([gpu]), path=os.environ.get("PATH", "/usr/bin:/bin"))
        env[SERVE_DIR] = str(serve_dir)
        process = await asyncio.create_subprocess_exec(
            # Its own lines to stderr: stdout is the JSON object's alone.
            sys.executable,
            "-m",
            "runners.serve",
            env={**os.environ, **env},
            stdout=sys.stderr,
        )
        try:
            client = await ReplicaClient.connect(serve_dir.parent, serve_dir, timeout_s=60)
            sha256 = hashlib.sha256(artifact.read_bytes()).hexdigest()
            load_ms = await client.load(artifact, sha256, MLP_ENTRY_POINT)
            rates, p50 = {}, {}
            for size in batch_sizes:
                items = [sample_input(n) for n in range(size)]
                await client.predict(items)  # warm up
                took = []
                started = time.perf_counter()
                while time.perf_counter() - started < seconds:
                    call = time.perf_counter()
                    await client.predict(items)
                    took.append(time.perf_counter() - call)
                rates[str(size)] = round(len(took) * size / (time.perf_counter() - started), 1)
                p50[str(size)] = round(statistics.median(took) * 1000, 3)
            await client.close()
            return {"load_ms": round(load_ms, 1), "items_per_s": rates, "call_p50_ms": p50}
        finally:
            process.terminate()
            await process.wait()


async def vision(
    gpu: str, archs: tuple[str, ...] = ("resnet18", "alexnet"), seconds: float = 5.0
) -> dict[str, Any]:
    """Inference jobs' queries on the GPU: BATCH generated 3x224x224 images a query, each model
    run directly here and as an inference job's replica runs it (`runners.serve` pinned to the
    GPU, fed generated items over its socket): queries per second, and the replica's load."""
    from runners.examples.vision import Classifier, servable_source
    from runners.inputs import generated_batch

    results: dict[str, Any] = {}
    for arch in archs:
        model = Classifier(arch, device="cuda")
        items = generated_batch([3, 224, 224], 7, 0, BATCH)
        model.predict(items)  # warm up (kernels chosen, memory taken)
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            model.predict(generated_batch([3, 224, 224], 7, calls * BATCH, BATCH))
            calls += 1
        direct = calls / (time.perf_counter() - started)
        with tempfile.TemporaryDirectory(prefix="trainyard-gpu-check-") as work:
            serve_dir = Path(work)
            artifact = serve_dir / f"{arch}.py"
            artifact.write_text(servable_source(arch))
            env = learner_env(_spec([gpu]), path=os.environ.get("PATH", "/usr/bin:/bin"))
            env[SERVE_DIR] = str(serve_dir)
            process = await asyncio.create_subprocess_exec(
                # Its own lines to stderr: stdout is the JSON object's alone.
                sys.executable,
                "-m",
                "runners.serve",
                env={**os.environ, **env},
                stdout=sys.stderr,
            )
            try:
                client = await ReplicaClient.connect(serve_dir.parent, serve_dir, timeout_s=60)
                sha256 = hashlib.sha256(artifact.read_bytes()).hexdigest()
                load_ms = await client.load(artifact, sha256, f"{arch}:predict")
                spec = {"shape": [3, 224, 224], "seed": 7}
                await client.predict_generated(spec, 0, BATCH)  # warm up
                calls, started = 0, time.perf_counter()
                while time.perf_counter() - started < seconds:
                    await client.predict_generated(spec, calls * BATCH, BATCH)
                    calls += 1
                served = calls / (time.perf_counter() - started)
                await client.close()
            finally:
                process.terminate()
                await process.wait()
        results[arch] = {
            "direct_queries_per_s": round(direct, 2),
            "replica_queries_per_s": round(served, 2),
            "replica_load_ms": round(load_ms, 1),
        }
    return {"batch": BATCH, "image": [3, 224, 224], **results}


DDP_STEPS = 20
DDP_TOLERANCE = 1e-4
"""What the GPU's weights may differ by from the CPU's after DDP_STEPS steps: float32 either way,
but cuBLAS and the CPU's BLAS sum in other orders, and Adam carries the differences forward."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _ddp_run(
    work: Path, name: str, world: int, *args: str, timeout_s: float = 300
) -> dict[str, Any]:
    """The DDP digits example run as `world` ranks on 127.0.0.1 (env://); rank 0's result file,
    with the weights it wrote (`name`.pt) beside it."""
    port = _free_port()
    command = [
        *(sys.executable, "-m", "runners.examples.digits_ddp", "--steps", str(DDP_STEPS)),
        *("--result", str(work / f"{name}.json"), "--weights", str(work / f"{name}.pt"), *args),
    ]
    contract = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world)}
    ranks = [
        subprocess.Popen(
            command,
            env={
                **os.environ,
                **contract,
                "RANK": str(rank),
                "TRAINYARD_RENDEZVOUS_TIMEOUT_S": "60",
            },
            # Its own lines to stderr: stdout is the JSON object's alone.
            stdout=sys.stderr,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    failures = []
    for rank, process in enumerate(ranks):
        _, stderr = process.communicate(timeout=timeout_s)
        if process.returncode != 0:
            failures.append(f"rank {rank} exited {process.returncode}: {stderr[-2000:]}")
    if failures:
        raise RuntimeError("; ".join(failures))
    done: dict[str, Any] = json.loads((work / f"{name}.json").read_text())
    return done


def distributed(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """The DDP digits example on the GPU (NCCL, one rank) against the CPU (gloo), and two ranks
    with gloo on CUDA tensors; {"skipped": why} where there is no GPU."""
    import torch

    if not gpus or not torch.cuda.is_available():
        return {"skipped": "no GPU here (NVML lists none, or CUDA is not available to torch)"}
    if importlib.util.find_spec("pydantic") is None:
        # runners.distributed runs without it, but the example's model is digits.py's, whose
        # hyperparameters are a pydantic model.
        return {"skipped": "pydantic is not installed: runners.examples.digits imports it"}
    nccl = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # torch leaves it bare
    result: dict[str, Any] = {
        "nccl_version": ".".join(map(str, nccl)),
        "steps": DDP_STEPS,
        "tolerance": DDP_TOLERANCE,
        "nccl_two_ranks": "not run: NCCL refuses two ranks on one GPU (duplicate GPU); "
        "two ranks run with gloo on CUDA tensors instead",
    }
    with tempfile.TemporaryDirectory(prefix="trainyard-gpu-check-") as work:
        folder = Path(work)
        try:
            started = time.perf_counter()
            gpu = _ddp_run(folder, "nccl", 1, "--backend", "nccl", "--device", "cuda")
            result["nccl_one_rank_s"] = round(time.perf_counter() - started, 1)
            cpu = _ddp_run(folder, "cpu", 1, "--backend", "gloo", "--device", "cpu")
            pair = _ddp_run(folder, "gloo_cuda", 2, "--backend", "gloo", "--device", "cuda")
        except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as error:
            # Reported, not raised: the other sections' results still come out.
            return {**result, "error": str(error)[-4000:]}
        weights = {
            name: torch.load(folder / f"{name}.pt", weights_only=True)
            for name in ("nccl", "cpu", "gloo_cuda")
        }

        def difference(a: str, b: str) -> float:
            return max(float((weights[a][key] - weights[b][key]).abs().max()) for key in weights[a])

        gpu_vs_cpu = difference("nccl", "cpu")
    return {
        **result,
        "nccl_one_rank_accuracy": gpu["accuracy"],
        "gloo_cpu_one_rank_accuracy": cpu["accuracy"],
        "nccl_vs_gloo_cpu_max_abs_diff": gpu_vs_cpu,
        "within_tolerance": gpu_vs_cpu <= DDP_TOLERANCE,
        "gloo_cuda_two_ranks_agree": pair["ranks_agree"],
        "gloo_cuda_two_ranks_vs_nccl_one_rank_max_abs_diff": difference("gloo_cuda", "nccl"),
    }


def main() -> int:
    gpus = inventory()
    result: dict[str, Any] = {
        "inventory": gpus,
        "pinning": pinning([gpu["uuid"] for gpu in gpus]),
        "docker": shutil.which("docker") is not None,
        "inference": inference() if gpus else None,
        "replica": asyncio.run(replica(gpus[0]["uuid"])) if gpus else None,
        "vision": asyncio.run(vision(gpus[0]["uuid"])) if gpus else None,
        "distributed": distributed(gpus),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
