"""The restore drill: a control plane at work on a Postgres whose WAL pgBackRest archives; an
instant noted; more work after it; the database restored to that instant into a fresh folder
(harness/backups.py: a full backup taken before, the archived WAL replayed up to the instant);
a control plane started on the restored database shows the jobs, the models and the audit
views exactly as they were at the instant, and nothing of what came after it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import aiohttp
import pytest

from controlplane.database import connect
from harness.backups import Archived, archived_postgres, missing
from harness.served import ServedControlPlane
from tests.controlplane.models.samples import DOCUMENT
from tests.polling import eventually
from trainyard import ApiError, AsyncClient, NotFound

pytestmark = [pytest.mark.postgres, pytest.mark.processes]

TENANT = "acme"
MODEL = "crystals"
IMAGE = "trainyard-test-drill"
"""Allowed by the tests' image list (tests/conftest.py); never run: the drill has no node."""
NOW_DEPENDENT = {
    "pending_reasons": {"seconds"},
    "gpu_allocations": {"duration", "gpu_hours"},
    "gpu_hours_by_tenant": {"gpu_hours"},
}
"""Columns of the audit views that count up to `now()` (an open span, a running attempt):
the only ones whose values move with the clock rather than with the log."""
METADATA = {key: value for key, value in DOCUMENT.items() if key != "provenance"}


@pytest.fixture
async def archived() -> AsyncIterator[Archived]:
    problem = missing()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the restore drill must run under CI: {problem}")
        pytest.skip(f"{problem} (./dev test installs it as root)")
    async with archived_postgres() as archived:
        yield archived


def manifest(name: str) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "command": ["python", "train.py"]}


async def tenant_token(plane: ServedControlPlane) -> str:
    headers = {"Authorization": f"Bearer {plane.admin_token}"}
    async with aiohttp.ClientSession(plane.url, headers=headers) as session:
        async with session.post("/v1/tenants", json={"name": TENANT}) as response:
            response.raise_for_status()
        async with session.post(f"/v1/tenants/{TENANT}/tokens") as response:
            response.raise_for_status()
            token: str = (await response.json())["token"]
            return token


async def state(url: str, client: AsyncClient) -> dict[str, Any]:
    """What a user and an auditor see: the tenant's jobs, the model and every audit view."""
    jobs = sorted(await client.jobs(limit=500), key=lambda job: str(job["id"]))
    try:
        model: dict[str, Any] | None = await client.model(MODEL)
    except ApiError:
        model = None
    owner = await connect(url, role=None)
    try:
        views = await owner.fetch(
            "SELECT table_name FROM information_schema.views WHERE table_schema = 'audit' "
            "ORDER BY table_name"
        )
        audit = {}
        for (view,) in views:
            rows = await owner.fetch(f'SELECT * FROM audit."{view}"')
            dropped = NOW_DEPENDENT.get(view, set())
            kept = [{k: v for k, v in row.items() if k not in dropped} for row in rows]
            audit[view] = sorted(kept, key=repr)
    finally:
        await owner.close()
    return {"jobs": jobs, "model": model, "audit": audit}


async def instant(url: str) -> datetime:
    owner = await connect(url, role=None)
    try:
        noted: datetime = await owner.fetchval("SELECT clock_timestamp()")
        return noted
    finally:
        await owner.close()


async def settled(url: str, client: AsyncClient) -> tuple[dict[str, Any], datetime]:
    """The state, and an instant at which it held: one read before the instant and one after
    agree, so nothing changed in between (the control plane's projections and recorders had
    caught up with what was done)."""
    while True:
        before = await state(url, client)
        noted = await instant(url)
        if await state(url, client) == before:
            return before, noted


async def test_a_database_restored_to_an_instant_is_as_it_was_then(
    archived: Archived, tmp_path: Path
) -> None:
    await archived.backup()
    home = tmp_path / "server"
    plane = ServedControlPlane(archived.url(), home)
    await plane.start()
    try:
        token = await tenant_token(plane)
        artifact = tmp_path / "weights.bin"
        async with AsyncClient(plane.url, token) as client:
            jobs = [(await client.submit(manifest(f"job-{i}")))["id"] for i in range(3)]
            await client.cancel(jobs[0], "changed my mind")
            artifact.write_bytes(b"version one")
            await client.publish_model(MODEL, artifact, METADATA)

            async def projected() -> bool:
                """The jobs listed, and the queued ones' pending reasons recorded (else the
                restored control plane's recorder would record them, after the instant)."""
                listed = {job["id"]: job["state"] for job in await client.jobs()}
                pending = await state(archived.url(), client)
                spans = {row["job_id"] for row in pending["audit"]["pending_reasons"]}
                return (
                    len(listed) == 3
                    and listed[jobs[0]] == "CANCELLED"
                    and {UUID(job) for job in jobs[1:]} <= spans
                )

            await eventually(projected)
            then, target = await settled(archived.url(), client)
            assert then["model"] is not None and then["model"]["latest"] == 1

            # After the instant: a job submitted, another cancelled, a second model version.
            later = (await client.submit(manifest("later")))["id"]
            await client.cancel(jobs[1], "after the instant")
            artifact.write_bytes(b"version two")
            await client.publish_model(MODEL, artifact, METADATA)
        # Whatever was committed is in the repository before the restore reads it.
        await archived.check()
    finally:
        await plane.stop()

    restored_dir = archived.root / "restored"
    await archived.restore(target, restored_dir)
    restored = await archived.start_restored(restored_dir)
    started = await instant(restored.url())
    again = ServedControlPlane(restored.url(), home)
    await again.start()
    try:
        async with AsyncClient(again.url, token) as client:
            now: dict[str, Any] = {}

            async def as_then() -> bool:
                nonlocal now
                now = await state(restored.url(), client)
                return now == then

            with contextlib.suppress(TimeoutError):  # the assertions below say what differs
                await eventually(as_then)
            assert now["jobs"] == then["jobs"]
            assert now["model"] == then["model"]
            for view, rows in then["audit"].items():
                assert (view, now["audit"][view]) == (view, rows)
            with pytest.raises(NotFound):
                await client.job(later)
            assert (await client.job(jobs[1]))["state"] == "QUEUED"
            assert (await client.model(MODEL))["latest"] == 1
        owner = await connect(restored.url(), role=None)
        try:
            # What the restored control plane recorded itself came after `started`.
            after = await owner.fetchval(
                "SELECT count(*) FROM events WHERE recorded_at > $1 AND recorded_at < $2",
                target,
                started,
            )
        finally:
            await owner.close()
        assert after == 0
    finally:
        await again.stop()
