"""Searches end to end on a real Postgres with real agents (process runtime): trials run as
jobs with their hyperparameters and budget in their environment, metrics are read from their
reports, ASHA promotes a trial into a job that resumes from the checkpoints its first rung left,
a failing trial is recorded and the search goes on, and a cancelled search stops its jobs."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

from tests.controlplane.deployments.serving import Client, serving_cluster
from tests.polling import eventually
from tests.tenancy import Tokens, auth, event_count

# A learner that scores its hyperparameter x (best at 3), checkpoints the step it reached, and
# on a promotion resumes from that checkpoint: it prints where it started.
SCORE = """
import json, os, pathlib
from runners import metrics
hp = json.loads(os.environ["TRAINYARD_HPARAMS"])
budget = int(os.environ["TRAINYARD_BUDGET"])
saved = json.loads(pathlib.Path(os.environ["TRAINYARD_HPARAMS_FILE"]).read_text())
assert saved == hp, (saved, hp)
folder = pathlib.Path(os.environ["TRAINYARD_CHECKPOINT_DIR"])
mark = folder / "reached"
start = int(mark.read_text()) if mark.exists() else 0
print(f"start {start} budget {budget}", flush=True)
if hp.get("fail"):
    raise SystemExit(3)
for step in range(start + 1, budget + 1):
    metrics.log(step=step, score=-(hp["x"] - 3) ** 2 - 1 / step)
mark.write_text(str(budget))
"""


def spec(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "name": "score",
        "trial": {
            "name": "t",
            "image": "img",
            "command": [sys.executable, "-c", SCORE],
            "max_restarts": 0,
        },
        "space": {"params": {"x": {"type": "uniform", "low": 0, "high": 6}}},
        "searcher": {"name": "random", "seed": 1},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"unit": "steps", "max": 4},
        "max_trials": 4,
        "max_concurrent_trials": 2,
    }
    document.update(changes)
    return document


async def submitted(client: Client, token: str, document: dict[str, Any]) -> str:
    response = await client.post("/v1/searches", json=document, headers=auth(token))
    assert response.status == 201, await response.text()
    body = await response.json()
    return str(body["id"])


async def ended(client: Client, token: str, search_id: str, seconds: float = 90) -> Any:
    async with asyncio.timeout(seconds):
        while True:
            response = await client.get(f"/v1/searches/{search_id}", headers=auth(token))
            # 404 until the searches projection has caught up with the submission.
            if response.status == 200:
                body = await response.json()
                if body["state"] != "running":
                    return body
            await asyncio.sleep(0.1)


async def trials_of(client: Client, token: str, search_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/searches/{search_id}/trials", headers=auth(token))
    if response.status == 404:
        return []  # the read model has not caught up with the submission yet
    assert response.status == 200
    return list((await response.json())["trials"])


async def test_a_random_search_runs_every_trial_and_exports_its_best(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path, agents=2) as (client, _):
        search_id = await submitted(client, tokens.acme, spec())
        search = await ended(client, tokens.acme, search_id)
        assert search["state"] == "completed", search
        trials = await trials_of(client, tokens.acme, search_id)
        assert [t["number"] for t in trials] == [0, 1, 2, 3]
        assert {t["state"] for t in trials} == {"completed"}
        for trial in trials:
            expected = -((trial["hparams"]["x"] - 3) ** 2) - 1 / 4
            assert abs(trial["metric"] - expected) < 1e-9
        top = max(trials, key=lambda t: t["metric"])
        assert search["best"]["trial"] == top["number"]
        best = await (
            await client.get(f"/v1/searches/{search_id}/best", headers=auth(tokens.acme))
        ).json()
        assert best["hparams"] == top["hparams"]
        manifest = best["manifest"]
        assert manifest["hparams"] == {"values": top["hparams"], "budget": 4, "unit": "steps"}
        # The export is a job a user may submit as it is.
        response = await client.post("/v1/jobs", json=manifest, headers=auth(tokens.acme))
        assert response.status == 201, await response.text()
        # Another tenant sees none of it.
        response = await client.get(f"/v1/searches/{search_id}", headers=auth(tokens.globex))
        assert response.status == 404
        listed = await (await client.get("/v1/searches", headers=auth(tokens.globex))).json()
        assert listed["searches"] == []


async def test_asha_promotes_into_a_job_that_resumes_from_the_trials_checkpoints(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    document = spec(
        searcher={"name": "asha", "min_budget": 1, "reduction": 2, "seed": 3},
        max_trials=4,
        max_concurrent_trials=1,
    )
    async with serving_cluster(db_url, tmp_path, agents=1) as (client, _):
        search_id = await submitted(client, tokens.acme, document)
        search = await ended(client, tokens.acme, search_id, seconds=120)
        assert search["state"] == "completed", search
        trials = await trials_of(client, tokens.acme, search_id)
        promoted = [t for t in trials if t["rung"] > 0]
        assert promoted, trials
        pool = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
        try:
            for trial in promoted:
                lines = await pool.fetch(
                    "SELECT line FROM job_logs WHERE job_id = $1 AND line LIKE 'start %'",
                    UUID(trial["job_id"]),
                )
                # Rungs of 1, 2 and 4 steps: the rung's job started where the rung before it
                # stopped, from the checkpoints of the trial's first job, not from scratch.
                rung = trial["rung"]
                expected = f"start {2 ** (rung - 1)} budget {2**rung}"
                assert [r["line"] for r in lines] == [expected]
        finally:
            await pool.close()


async def test_a_failing_trial_is_recorded_and_the_search_goes_on_within_its_limit(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    space = {
        "params": {
            "x": {"type": "uniform", "low": 0, "high": 6},
            "fail": {"type": "choice", "values": [True, False]},
        }
    }
    async with serving_cluster(db_url, tmp_path, agents=2) as (client, _):
        search_id = await submitted(
            client, tokens.acme, spec(space=space, max_trials=6, max_failed_trials=6)
        )
        search = await ended(client, tokens.acme, search_id)
        trials = await trials_of(client, tokens.acme, search_id)
        failed = [t for t in trials if t["hparams"]["fail"]]
        assert failed and all(t["state"] == "failed" for t in failed)
        assert all("ended FAILED" in t["reason"] for t in failed)
        assert search["state"] == "completed"
        assert len(trials) == 6
        # With none tolerated, the first failure fails the search and stops its other trials.
        strict = await submitted(client, tokens.acme, spec(space=space, max_trials=6, name="s"))
        result = await ended(client, tokens.acme, strict)
        assert result["state"] == "failed", result
        assert "max_failed_trials is 0" in result["reason"]
        states = {t["state"] for t in await trials_of(client, tokens.acme, strict)}
        assert "failed" in states and "running" not in states


async def test_cancelling_a_search_cancels_its_running_trials(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    slow = {**spec()["trial"], "command": [sys.executable, "-c", "import time; time.sleep(60)"]}
    async with serving_cluster(db_url, tmp_path, agents=2) as (client, _):
        search_id = await submitted(client, tokens.acme, spec(trial=slow))

        async def both_running() -> bool:
            return len(await trials_of(client, tokens.acme, search_id)) == 2

        await eventually(both_running)
        trials = await trials_of(client, tokens.acme, search_id)
        response = await client.post(
            f"/v1/searches/{search_id}/cancel", headers=auth(tokens.acme), json={"reason": "enough"}
        )
        assert response.status == 200, await response.text()

        async def jobs_cancelled() -> bool:
            for trial in trials:
                url = f"/v1/jobs/{trial['job_id']}"
                job = await (await client.get(url, headers=auth(tokens.acme))).json()
                if job["state"] != "CANCELLED":
                    return False
            return True

        await eventually(jobs_cancelled, seconds=30)

        async def trials_cancelled() -> bool:
            states = {t["state"] for t in await trials_of(client, tokens.acme, search_id)}
            return states == {"cancelled"}

        await eventually(trials_cancelled)  # as the read model catches up
        again = await client.post(f"/v1/searches/{search_id}/cancel", headers=auth(tokens.acme))
        assert again.status == 409


async def test_a_bad_search_is_refused_and_writes_nothing(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    owner = await asyncpg.connect(db_url)
    try:
        async with serving_cluster(db_url, tmp_path, agents=0) as (client, _):
            before = await event_count(owner)
            bad = [
                spec(max_trials=0),
                spec(space={"params": {"x": {"type": "uniform", "low": 5, "high": 1}}}),
                spec(trial={**spec()["trial"], "env": {"TRAINYARD_HPARAMS": "{}"}}),
                spec(
                    trial={
                        **spec()["trial"],
                        "hparams": {"values": {}, "budget": 1, "unit": "steps"},
                    }
                ),
                spec(searcher={"name": "asha", "min_budget": 9}),
                spec(trial={**spec()["trial"], "image": "evil/image"}),
                {"name": "x"},
            ]
            for document in bad:
                response = await client.post(
                    "/v1/searches", json=document, headers=auth(tokens.acme)
                )
                assert response.status in (400, 422), (document, await response.text())
                assert "message" in await response.json() or "error" in await response.json()
            # NaN is not JSON (Python's parser takes it; stored, it would come back as null).
            nan = json.dumps(spec(space={"params": {"x": {"type": "choice", "values": [1]}}}))
            nan = nan.replace("[1]", "[NaN, 1]")
            headers = {"Content-Type": "application/json", **auth(tokens.acme)}
            response = await client.post("/v1/searches", data=nan, headers=headers)
            assert response.status == 400, await response.text()
            # More trials at once than the tenant may queue jobs.
            admin = auth(tokens.admin)
            limited = await client.put(
                "/v1/tenants/acme/limits", json={"queued_jobs": 2}, headers=admin
            )
            assert limited.status == 200, await limited.text()
            wide = spec(max_concurrent_trials=3)
            response = await client.post("/v1/searches", json=wide, headers=auth(tokens.acme))
            assert response.status == 422 and "max_concurrent_trials" in await response.text()
            await asyncio.sleep(0.2)
            assert await event_count(owner) == before + 1  # the limits' change, nothing else
    finally:
        await owner.close()


async def test_a_retried_submission_finds_its_search_and_a_reused_key_is_refused(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    owner = await asyncpg.connect(db_url)
    try:
        async with serving_cluster(db_url, tmp_path, agents=0) as (client, _):
            key = {"Idempotency-Key": "search-1", **auth(tokens.acme)}
            first = await client.post("/v1/searches", json=spec(), headers=key)
            assert first.status == 201, await first.text()
            events = await event_count(owner)
            again = await client.post("/v1/searches", json=spec(), headers=key)
            assert again.status == 201
            assert again.headers["Idempotent-Replayed"] == "true"
            assert (await again.json())["id"] == (await first.json())["id"]
            other = await client.post("/v1/searches", json=spec(max_trials=5), headers=key)
            assert other.status == 409
            assert await event_count(owner) == events  # nothing written twice, or for the 409
            # The same key is another tenant's own.
            theirs = {"Idempotency-Key": "search-1", **auth(tokens.globex)}
            separate = await client.post("/v1/searches", json=spec(), headers=theirs)
            assert (await separate.json())["id"] != (await first.json())["id"]
    finally:
        await owner.close()
