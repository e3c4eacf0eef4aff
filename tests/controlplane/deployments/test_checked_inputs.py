"""Items checked against the model version's declared input at the API, on a real Postgres,
through HTTP: a synchronous, an asynchronous and a pipeline's prediction of an item the model
does not take is a 422 naming the item and saying what was expected; nothing is queued. No
agent runs: a refused request never reaches one, and an accepted one waits in the queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg

from tests.controlplane.deployments.serving import (
    Client,
    deploy,
    metadata,
    predict,
    publish,
    serving_cluster,
)
from tests.tenancy import Tokens, auth

SUMS = b"def predict(batch):\n    return [sum(x) for x in batch]\n"
EXPECTED = (
    "expected an item of shape [4] of float32 numbers, got shape [3] (the model takes [*, 4])"
)


def vectors() -> dict[str, Any]:
    """Metadata whose servable takes batches of 4 float32 numbers an item."""
    document = metadata("sums:predict")
    document["servable"]["input"] = {"type": "ndarray", "dtype": "float32", "shape": [None, 4]}
    return document


async def deployed(client: Client, token: str) -> None:
    await publish(client, token, "sums", SUMS, "sums:predict", document=vectors())
    await deploy(client, token, name="sums", model="sums", replicas=0)


async def queued(pool: asyncpg.Pool) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM serving_tasks")
    return count


async def test_a_synchronous_prediction_of_an_item_of_another_shape_is_refused(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path, agents=0) as (client, _):
        await deployed(client, tokens.acme)
        status, body = await predict(client, tokens.acme, "sums", [[1, 2, 3, 4], [1, 2, 3]])
        assert (status, body["field"], body["error"]) == (422, "inputs.1", EXPECTED)
        status, body = await predict(client, tokens.acme, "sums", [[1, 2, 3, "4"]])
        assert (status, body["field"]) == (422, "inputs.0")
        assert body["error"].endswith("got a string at [3] (the model takes [*, 4])")
        assert await queued(pool) == 0


async def test_an_asynchronous_prediction_is_checked_before_it_is_queued(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path, agents=0) as (client, _):
        await deployed(client, tokens.acme)
        items = [[1, 2, 3, 4]] * 5 + [[1, 2, 3]]
        status, body = await predict(client, tokens.acme, "sums", items, **{"async": True})
        assert (status, body["field"], body["error"]) == (422, "inputs.5", EXPECTED)
        assert await queued(pool) == 0
        # Items it takes are queued as ever (none of any size but the batch's).
        status, body = await predict(client, tokens.acme, "sums", items[:5], **{"async": True})
        assert (status, body["items"]) == (202, 5)
        assert await queued(pool) == 1


async def test_a_pipeline_s_items_are_checked_against_its_first_step(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path, agents=0) as (client, _):
        await deployed(client, tokens.acme)
        # The second step takes numbers: what the first returns, never the request's items.
        document = metadata("sums:predict")
        document["servable"]["input"] = {"type": "number"}
        await publish(client, tokens.acme, "scalar", SUMS, "sums:predict", document=document)
        await deploy(client, tokens.acme, name="scalar", model="scalar", replicas=0)
        response = await client.post(
            "/v1/pipelines",
            json={"name": "chain", "steps": ["sums", "scalar"]},
            headers=auth(tokens.acme),
        )
        assert response.status == 201, await response.text()
        response = await client.post(
            "/v1/pipelines/chain/predict",
            json={"inputs": [[1, 2, 3]], "async": True},
            headers=auth(tokens.acme),
        )
        body = await response.json()
        assert (response.status, body["field"], body["error"]) == (422, "inputs.0", EXPECTED)
        assert await queued(pool) == 0
        response = await client.post(
            "/v1/pipelines/chain/predict",
            json={"inputs": [[1, 2, 3, 4]], "async": True},
            headers=auth(tokens.acme),
        )
        assert response.status == 202, await response.text()
        assert await queued(pool) == 1
