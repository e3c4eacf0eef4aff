"""The demo job of `trainyard up`: a small real PyTorch training run, submitted over HTTP as
tenant `demo`, with its status and logs streamed to the terminal from the SSE endpoints."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from controlplane.events.store import EventStore
from controlplane.jobs.images import DEFAULT_IMAGES
from controlplane.projections.runner import ProjectionRunner
from controlplane.tenants.errors import TenantExists
from controlplane.tenants.service import create_tenant
from runners import protocol
from trainyard.api import sse_messages

TENANT = "demo"
TOKEN_FILE = "demo-token"


def manifest() -> dict[str, Any]:
    return {
        "name": "demo-classifier",
        # The learner image (the default of TRAINYARD_IMAGES); unused by the process runtime
        # `up` runs, whose agent runs on this machine: the interpreter that runs Trainyard has
        # torch.
        "image": DEFAULT_IMAGES,
        "command": [sys.executable, "-m", "runners.examples.classifier", "--steps", "400"],
        "framework": "pytorch",
        "gpus_per_learner": 0,
        "cpus": 1,
        "memory_mb": 4096,
        "checkpoint": {"interval_seconds": 5, "keep": 2},
        "max_restarts": 1,
        "labels": {"demo": "true"},
    }


async def demo_token(store: EventStore, runner: ProjectionRunner, home: Path) -> str:
    """The demo tenant's token: created (and kept in `home`, mode 0600) on the first run."""
    path = home / TOKEN_FILE
    try:
        token = await create_tenant(store, runner, TENANT, actor="system:up")
    except TenantExists:
        return path.read_text().strip()
    path.touch(mode=0o600)
    path.write_text(token.plaintext + "\n")
    return token.plaintext


async def run_demo(base_url: str, token: str) -> str:
    """Submit the demo job and print its status and logs until it ends; returns its state."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(base_url, headers=headers) as session:
        async with session.post("/v1/jobs", json=manifest()) as response:
            body = await response.json()
            if response.status != 201:
                raise RuntimeError(f"submitting the demo job: {response.status} {body}")
        job_id = body["id"]
        print(f"demo job {job_id} submitted (tenant {TENANT}); following its status and logs")
        async with asyncio.TaskGroup() as group:
            status = group.create_task(_follow_status(session, job_id))
            group.create_task(_follow_logs(session, job_id))
        return status.result()


async def _sse(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    async for message in sse_messages(response.content):
        yield message.event, message.json()


async def _follow_status(session: aiohttp.ClientSession, job_id: str) -> str:
    state = "QUEUED"
    async with session.get(f"/v1/jobs/{job_id}/events") as response:
        response.raise_for_status()
        async for _, event in _sse(response):
            state = event["state"]
            detail = event["data"].get("reason") or ", ".join(event["data"].get("nodes", []))
            suffix = f" ({detail})" if detail else ""
            print(f"[status] {event['type']}: {state}, attempt {event['attempt']}{suffix}")
    return state


async def _follow_logs(session: aiohttp.ClientSession, job_id: str) -> None:
    # With the launcher's reports (left out by default): its metrics are shown readably.
    params = {"follow": "true", "protocol": "true"}
    async with session.get(f"/v1/jobs/{job_id}/logs", params=params) as response:
        response.raise_for_status()
        async for event, line in _sse(response):
            if event == "line" and (text := _readable(line["line"])):
                print(f"[learner {line['learner']}] {text}")


def _readable(line: str) -> str | None:
    """A log line for people: the learner's reports to the agent (stored as lines too) shown
    as metrics and checkpoints; phase reports are left to the status stream."""
    match protocol.parse(line):
        case None:
            return line
        case protocol.Metric(step=step, values=values):
            shown = ", ".join(f"{name} {value:.4g}" for name, value in values.items())
            return f"step {step}: {shown}"
        case protocol.CheckpointSaved(step=step, size_bytes=size):
            return f"checkpoint saved at step {step} ({size / 1024:.0f} KiB)"
        case protocol.CheckpointRestored(step=step):
            return f"resumed from the checkpoint at step {step}"
    return None
