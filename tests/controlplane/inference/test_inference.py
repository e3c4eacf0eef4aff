"""Inference jobs end to end, on a real Postgres, through the HTTP API, with real replicas (the
process runtime) fed by real agents: a job's queries each run once, in order, with exact
statistics; a job is a job (states, history, cancel); hostile requests change nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg

from tests.controlplane.deployments.serving import Client, publish, serving_cluster
from tests.polling import eventually
from tests.tenancy import Tokens, auth

# Each item is a generated float32 array (or a JSON item): its sum, rounded, and its length.
SUMS = (
    b"def predict(batch):\n"
    b"    return [{'sum': round(float(sum(x)), 4), 'n': len(x)} for x in batch]\n"
)


async def submit(client: Client, token: str, **request: Any) -> dict[str, Any]:
    response = await client.post("/v1/inference", json=request, headers=auth(token))
    assert response.status == 201, await response.text()
    view: dict[str, Any] = await response.json()
    return view


async def until_state(client: Client, token: str, job_id: str, state: str) -> dict[str, Any]:
    view: dict[str, Any] = {}

    async def reached() -> bool:
        nonlocal view
        response = await client.get(f"/v1/jobs/{job_id}", headers=auth(token))
        view = await response.json()
        return bool(view["state"] == state)

    await eventually(reached, seconds=90)
    return view


async def stats(client: Client, token: str, job_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/jobs/{job_id}/stats", headers=auth(token))
    assert response.status == 200, await response.text()
    view: dict[str, Any] = await response.json()
    return view


async def test_a_finite_job_runs_each_query_once_in_order(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "sums", SUMS, "sums:predict")
        job = await submit(
            client,
            tokens.acme,
            name="sums-of-noise",
            model="sums",
            input={"generate": {"shape": [8], "seed": 3}},
            batch_size=4,
            queries=5,
        )
        assert job["state"] == "QUEUED"
        done = await until_state(client, tokens.acme, job["id"], "COMPLETED")
        assert [t["state"] for t in done["transitions"]] == ["QUEUED", "PROCESSING", "COMPLETED"]
        response = await client.get(f"/v1/jobs/{job['id']}/queries", headers=auth(tokens.acme))
        page = await response.json()
        assert [q["index"] for q in page["queries"]] == [0, 1, 2, 3, 4]
        assert all(q["state"] == "succeeded" and q["tries"] == 1 for q in page["queries"])
        assert all(len(q["outputs"]) == 4 and q["outputs"][0]["n"] == 8 for q in page["queries"])
        # Items are the generator's, by number: the same seed and index give the same sum.
        sums = [o["sum"] for q in page["queries"] for o in q["outputs"]]
        assert len(set(sums)) == 20
        figures = await stats(client, tokens.acme, job["id"])
        assert figures["queries"]["finished"] == figures["queries"]["succeeded"] == 5
        latency = figures["latency_ms"]
        assert 0 < latency["min"] <= latency["median"] <= latency["p99"] <= latency["max"]
        assert len(figures["replicas"]) == 1
        assert figures["replicas"][0]["queries"]["finished"] == 5
        # Another tenant sees neither the job nor its figures.
        response = await client.get(f"/v1/jobs/{job['id']}/stats", headers=auth(tokens.globex))
        assert response.status == 404


async def test_items_given_with_the_job(db_url: str, tmp_path: Path, tokens: Tokens) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "sums", SUMS, "sums:predict")
        items = [[n, n + 1] for n in range(5)]
        job = await submit(
            client, tokens.acme, name="given", model="sums", input={"items": items}, batch_size=2
        )
        await until_state(client, tokens.acme, job["id"], "COMPLETED")
        response = await client.get(f"/v1/jobs/{job['id']}/queries", headers=auth(tokens.acme))
        outputs = [o["sum"] for q in (await response.json())["queries"] for o in q["outputs"]]
        assert outputs == [2 * n + 1 for n in range(5)]


async def test_hostile_requests_change_nothing(db_url: str, tmp_path: Path, tokens: Tokens) -> None:
    async with serving_cluster(db_url, tmp_path, agents=0) as (client, _):
        await publish(client, tokens.acme, "sums", SUMS, "sums:predict")
        good = {"name": "x", "model": "sums", "input": {"generate": {"shape": [4]}}}
        cases: list[tuple[dict[str, Any], int, str]] = [
            ({**good, "model": "nope"}, 404, "model"),
            ({**good, "input": {}}, 422, "input"),
            ({**good, "input": {"generate": {"shape": [1 << 20, 1 << 20]}}}, 422, "input"),
            ({**good, "input": {"items": ["a\u0000"]}}, 422, "input"),
            ({**good, "weight": 0}, 422, "weight"),
            ({**good, "batch_size": 0}, 422, "batch_size"),
            ({**good, "input": {"items": [1, 2]}, "queries": 3}, 422, ""),
            ({**good, "resources": {"image": "evil/image"}}, 422, "resources.image"),
            ({**good, "surprise": 1}, 422, "surprise"),
        ]
        for request, status, field in cases:
            response = await client.post("/v1/inference", json=request, headers=auth(tokens.acme))
            body = await response.json()
            assert response.status == status, (request, body)
            assert field in (body.get("field") or "") + str(body), (request, body)
        response = await client.get("/v1/jobs", headers=auth(tokens.acme))
        assert (await response.json())["jobs"] == []
        # The deployments of inference jobs are theirs: a user cannot take such a name.
        response = await client.post(
            "/v1/deployments",
            json={"name": "inference-0123456789abcdef", "model": "sums"},
            headers=auth(tokens.acme),
        )
        assert response.status == 422


async def test_cancel_stops_its_queries_and_its_replicas(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "sums", SUMS, "sums:predict")
        job = await submit(
            client,
            tokens.acme,
            name="endless",
            model="sums",
            input={"generate": {"shape": [4]}},
            batch_size=2,
        )
        await until_state(client, tokens.acme, job["id"], "PROCESSING")
        response = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(tokens.acme))
        assert response.status == 200, await response.text()
        conn = await asyncpg.connect(db_url)
        try:

            async def stopped() -> bool:
                rows = await conn.fetch(
                    "SELECT state FROM job_status WHERE doc -> 'manifest' -> 'servable' "
                    "->> 'inference_job' = $1",
                    job["id"],
                )
                return bool(rows) and all(
                    r["state"] in ("CANCELLED", "COMPLETED", "FAILED") for r in rows
                )

            await eventually(stopped, seconds=60)
            finished = await conn.fetchval(
                "SELECT count(*) FROM inference_queries WHERE job_id = $1 AND state = 'succeeded'",
                job["id"],
            )
            assert finished >= 1
        finally:
            await conn.close()
        figures = await stats(client, tokens.acme, job["id"])
        assert figures["state"] == "CANCELLED"
