"""`python -m bench.gpu_check`: what a GPU machine shows of the agent's real GPU path, as JSON.

Run where a GPU is (it proves nothing elsewhere):
- inventory: the GPUs the agent's NVML inventory offers (index, UUID, model, memory, health),
  and its utilization reading;
- pinning: a learner's environment as the agent builds it (`learner_env`) for each GPU, run as
  a child process that asks CUDA what it sees: exactly that GPU (its UUID matched through
  torch), and with no GPU given, none at all;
- docker: whether an engine answers here (the Docker runtime's pinning needs one);
- inference: the serving benchmark's MLP run directly on the GPU (no Trainyard), items per
  second at batch sizes 1, 8 and 32: the ceiling a replica on this GPU can approach.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.serving_model import MLP_SOURCE, sample_input
from node_agent.inventory import open_inventory
from node_agent.runtime import LearnerSpec, learner_env

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


def seen_with(gpus: list[str]) -> dict[str, Any]:
    """What a learner given `gpus` sees, with the environment the agent gives it."""
    spec = LearnerSpec(
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
    env = learner_env(spec, path="/usr/bin:/bin")
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


def main() -> int:
    gpus = inventory()
    result: dict[str, Any] = {
        "inventory": gpus,
        "pinning": pinning([gpu["uuid"] for gpu in gpus]),
        "docker": shutil.which("docker") is not None,
        "inference": inference() if gpus else None,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
