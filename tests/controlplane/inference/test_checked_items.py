"""An inference job's input set checked against its model version's declared input when it is
submitted, on a real Postgres, through HTTP: an item given with the job, or generated items of
a shape, that the model does not take is a 422 naming it; no job, no row, no deployment."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from tests.controlplane.deployments.serving import metadata, publish, serving_cluster
from tests.tenancy import Tokens, auth

SUMS = b"def predict(batch):\n    return [sum(x) for x in batch]\n"


async def test_items_and_generated_shapes_the_model_does_not_take_are_refused(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    document = metadata("sums:predict")
    document["servable"]["input"] = {"type": "ndarray", "dtype": "float32", "shape": [None, 4]}
    async with serving_cluster(db_url, tmp_path, agents=0) as (client, _):
        await publish(client, tokens.acme, "sums", SUMS, "sums:predict", document=document)
        good = {"name": "x", "model": "sums", "batch_size": 2}
        cases = [
            (
                {"items": [[1, 2, 3, 4]] * 3 + [[1, 2, 3, 4, 5]]},
                "input.items.3",
                "expected an item of shape [4] of float32 numbers, got shape [5] "
                "(the model takes [*, 4])",
            ),
            (
                {"generate": {"shape": [3, 4]}},
                "input.generate.shape",
                "expected an item of shape [4] of float32 numbers, got generated items of "
                "shape [3, 4] of float32 numbers (the model takes [*, 4])",
            ),
        ]
        for source, field, said in cases:
            response = await client.post(
                "/v1/inference", json={**good, "input": source}, headers=auth(tokens.acme)
            )
            body = await response.json()
            assert (response.status, body["field"], body["error"]) == (422, field, said)
        response = await client.get("/v1/jobs", headers=auth(tokens.acme))
        assert (await response.json())["jobs"] == []
        assert await pool.fetchval("SELECT count(*) FROM inference_jobs") == 0
        response = await client.get("/v1/deployments", headers=auth(tokens.acme))
        assert (await response.json())["items"] == []
        # What it takes is submitted as ever.
        for source in ({"items": [[1, 2, 3, 4]]}, {"generate": {"shape": [4]}}):
            response = await client.post(
                "/v1/inference", json={**good, "input": source}, headers=auth(tokens.acme)
            )
            assert response.status == 201, await response.text()
