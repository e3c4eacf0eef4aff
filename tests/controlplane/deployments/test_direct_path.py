"""The direct path of synchronous predictions, on a real Postgres with real replicas (the
process runtime) behind a real agent's serving channel: a prediction reaches its replica with
no claim of a queued row, and is counted after; the channel takes only its agent's token; an
unreachable channel sends the request to the queue; a memo hit is answered from memory; and the
counting is written out by a graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import asyncpg

from controlplane.deployments.counting import CountedTask, Counting
from controlplane.deployments.memo_cache import MemoCache
from controlplane.http.keys import PLANE
from node_agent.serving_channel import advertised, parse_listen
from tests.cluster import agent_config
from tests.controlplane.deployments.serving import deploy, predict, publish, serving_cluster
from tests.controlplane.deployments.serving import until_serving as until_running
from tests.controlplane.deployments.test_serving import DOUBLE
from tests.polling import eventually
from tests.tenancy import Tokens, auth


async def until_offered(pool: asyncpg.Pool, deployment: str) -> asyncpg.Record:
    """The deployment's replica once its agent has offered it on its channel."""
    found: asyncpg.Record | None = None

    async def offered() -> bool:
        nonlocal found
        found = await pool.fetchrow(
            "SELECT * FROM serving_channels WHERE deployment = $1", deployment
        )
        return found is not None

    await eventually(offered, seconds=60)
    assert found is not None
    return found


async def test_a_synchronous_prediction_claims_no_row_and_is_counted_after(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await deploy(client, tokens.acme, name="dbl", model="double", serving={"memo": False})
        await until_running(client, tokens.acme, "dbl", 1)
        channel = await until_offered(pool, "dbl")
        status, task = await predict(client, tokens.acme, "dbl", [1, 2, 3])
        assert (status, task["status"], task["outputs"]) == (200, "succeeded", [2, 4, 6])
        assert task["times"]["steps"][0]["replica"] == str(channel["replica"])
        # Counted once answered, off the request's path: the same row as a queued task's, but
        # never claimed (a claim is the queue's path, and stamps claimed_at).
        response = await client.get(f"/v1/tasks/{task['task_id']}", headers=auth(tokens.acme))
        assert response.status == 200
        assert (await response.json())["outputs"] == [2, 4, 6]
        row = await pool.fetchrow(
            "SELECT state, claim, claimed_at, tries, replica, step_times::text AS steps"
            " FROM serving_tasks WHERE task_id = $1",
            uuid.UUID(task["task_id"]),
        )
        assert row is not None
        assert (row["state"], row["claim"], row["claimed_at"], row["tries"]) == (
            "succeeded",
            None,
            None,
            1,
        )
        assert row["replica"] == channel["replica"]
        batch = json.loads(row["steps"])[0]["batch"]
        recorded = await pool.fetchrow(
            "SELECT tasks, items, outcome FROM serving_batches WHERE batch_id = $1",
            uuid.UUID(batch),
        )
        assert recorded is not None
        assert tuple(recorded) == (1, 3, "succeeded")
        response = await client.get("/v1/deployments/dbl/metrics", headers=auth(tokens.acme))
        figures = await response.json()
        assert (figures["requests"], figures["succeeded"], figures["batches"]["count"]) == (
            1,
            1,
            1,
        )


async def test_the_channel_refuses_a_request_without_its_agents_token(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await deploy(client, tokens.acme, name="dbl", model="double", serving={"memo": False})
        await until_running(client, tokens.acme, "dbl", 1)
        channel = await until_offered(pool, "dbl")
        url = f"{channel['address']}/v1/replicas/{channel['replica']}/predict"
        ours = {"tenant": "acme", "deployment": "dbl"}
        async with aiohttp.ClientSession() as session:
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": f"Bearer {tokens.acme}"},  # a tenant's token is no use
                {"Authorization": f"Basic {channel['token']}"},
            ):
                async with session.post(url, params=ours, json=[1], headers=headers) as response:
                    assert response.status == 401, headers
            good = {"Authorization": f"Bearer {channel['token']}"}
            other = {**ours, "tenant": "globex"}
            async with session.post(url, params=other, json=[1], headers=good) as response:
                assert response.status == 404  # the replica is acme's deployment's only
            async with session.post(url, params=ours, json=[1], headers=good) as response:
                assert response.status == 200
                assert json.loads((await response.json())["output"]) == [2]


async def test_an_unreachable_channel_sends_the_prediction_to_the_queue(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await deploy(client, tokens.acme, name="dbl", model="double", serving={"memo": False})
        await until_running(client, tokens.acme, "dbl", 1)
        await until_offered(pool, "dbl")
        # An agent that died, or a network that parts them: nothing listens there.
        await owner.execute(
            "UPDATE serving_channels SET address = 'http://127.0.0.1:1' WHERE deployment = 'dbl'"
        )
        status, task = await predict(client, tokens.acme, "dbl", [21])
        assert (status, task["status"], task["outputs"]) == (200, "succeeded", [42])
        claimed = await pool.fetchval(
            "SELECT claimed_at FROM serving_tasks WHERE task_id = $1", uuid.UUID(task["task_id"])
        )
        assert claimed is not None  # the queue's path: a row claimed by the replica's feed


async def test_an_agent_without_a_channel_serves_synchronous_predictions_from_the_queue(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    config = dataclasses.replace(agent_config(tmp_path, "n1"), serving_listen=None)
    async with serving_cluster(db_url, tmp_path, configs=[config]) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await deploy(client, tokens.acme, name="dbl", model="double", serving={"memo": False})
        await until_running(client, tokens.acme, "dbl", 1)
        status, task = await predict(client, tokens.acme, "dbl", [4])
        assert (status, task["outputs"]) == (200, [8])
        assert await pool.fetchval("SELECT count(*) FROM serving_channels") == 0
        claimed = await pool.fetchval(
            "SELECT claimed_at FROM serving_tasks WHERE task_id = $1", uuid.UUID(task["task_id"])
        )
        assert claimed is not None


def test_the_channels_address_is_one_the_control_plane_can_reach() -> None:
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:7000") == ("::1", 7000)
    for wrong in ("7000", "host:", ":7000", "host:99999", "host:x"):
        try:
            parse_listen(wrong)
        except ValueError:
            continue
        raise AssertionError(f"{wrong!r} taken")
    assert advertised("127.0.0.1", 7000) == "http://127.0.0.1:7000"
    assert advertised("::1", 7000) == "http://[::1]:7000"
    assert not advertised("0.0.0.0", 7000).startswith("http://0.0.0.0")


async def test_a_memo_hit_is_answered_from_memory(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await deploy(client, tokens.acme, name="dbl", model="double", serving={"memo": True})
        await until_running(client, tokens.acme, "dbl", 1)
        await until_offered(pool, "dbl")
        status, task = await predict(client, tokens.acme, "dbl", [5])
        assert (status, task["memo"], task["outputs"]) == (200, "miss", [10])
        await client.get("/v1/deployments/dbl/metrics", headers=auth(tokens.acme))  # flushed
        assert await pool.fetchval("SELECT count(*) FROM serving_memo") == 1
        # The durable memo emptied: only this process's memory still has the result.
        await pool.execute("DELETE FROM serving_memo")
        status, hit = await predict(client, tokens.acme, "dbl", [5])
        assert (status, hit["memo"], hit["outputs"]) == (200, "hit", [10])
        assert hit["times"]["invocation_ms"] is None
        response = await client.get("/v1/deployments/dbl/metrics", headers=auth(tokens.acme))
        memo = (await response.json())["memo"]
        assert (memo["hits"], memo["misses"], memo["entries"]) == (1, 1, 1)
        # The hit's row names its input by the memo's key (the miss's, which holds the input)
        # instead of a copy of it; read back, audited and counted as any task.
        rows = await pool.fetch(
            "SELECT task_id, memo, memo_key, input::text AS input FROM serving_tasks"
            " ORDER BY submitted_at"
        )
        assert [(r["memo"], r["input"]) for r in rows] == [("miss", "[5]"), ("hit", "null")]
        assert rows[0]["memo_key"] == rows[1]["memo_key"] is not None
        response = await client.get(f"/v1/tasks/{hit['task_id']}", headers=auth(tokens.acme))
        assert (await response.json())["outputs"] == [10]
        audited = await owner.fetchrow(
            "SELECT memo, items, state FROM audit.serving_tasks WHERE task_id = $1",
            rows[1]["task_id"],
        )
        assert audited is not None and tuple(audited) == ("hit", 1, "succeeded")


def test_the_memory_memo_keeps_each_deployments_bound_and_its_bytes() -> None:
    cache = MemoCache(max_bytes=10)
    cache.put("acme", "a", b"1", "[1]", max_entries=2)
    cache.put("acme", "a", b"2", "[2]", max_entries=2)
    assert cache.get("acme", "a", b"1") == "[1]"  # now the most recently used
    cache.put("acme", "a", b"3", "[3]", max_entries=2)
    assert (cache.get("acme", "a", b"2"), cache.get("acme", "a", b"1")) == (None, "[1]")
    assert cache.get("globex", "a", b"1") is None  # keyed by tenant
    cache.put("acme", "b", b"1", "[4444]", max_entries=2)  # 12 bytes: the oldest go
    assert (len(cache), cache.bytes) == (2, 9)
    assert (cache.get("acme", "a", b"3"), cache.get("acme", "a", b"1")) == (None, "[1]")
    cache.put("acme", "b", b"9", "x" * 11, max_entries=2)  # larger than the whole: not kept
    assert cache.get("acme", "b", b"9") is None


async def test_counting_is_written_out_by_a_graceful_shutdown(
    db_url: str, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    counting = Counting(pool)
    now = datetime.now(UTC)
    ids = [uuid.uuid4() for _ in range(50)]
    for task_id in ids:
        counting.record(
            CountedTask(
                task_id=task_id,
                tenant="acme",
                deployment="dbl",
                items=1,
                input="[1]",
                state="succeeded",
                output="[2]",
                error=None,
                memo="off",
                memo_key=None,
                replica=uuid.uuid4(),
                tries=1,
                submitted_at=now,
                finished_at=now,
                step_times="[]",
            )
        )
    # Stopped before it ever ran (a shutdown right after the answers): it still writes all.
    counting.stop()
    await counting.run()
    await counting.flush()
    written = await pool.fetchval(
        "SELECT count(*) FROM serving_tasks WHERE task_id = ANY($1::uuid[])", ids
    )
    assert written == len(ids)


def slow_sizes(seconds: float) -> bytes:
    """SIZES (each item's output its batch's size), each call taking `seconds`: long enough
    for requests sent meanwhile to arrive while it runs."""
    return (
        f"import time\n\ndef predict(batch):\n    time.sleep({seconds})\n"
        "    return [len(batch)] * len(batch)\n"
    ).encode()


SLOW_SIZES = slow_sizes(1)
"""SIZES, each call taking a second."""


async def test_an_idle_replica_runs_a_request_at_once_and_a_call_gathers_the_next_batch(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path, as_deployed=True) as (client, _):
        await publish(client, tokens.acme, "slow", slow_sizes(2), "slow:predict")
        # A long window: a lone request does not wait for it.
        serving = {"max_batch_size": 3, "max_wait_ms": 2000, "memo": False}
        await deploy(client, tokens.acme, name="slow", model="slow", serving=serving)
        await until_running(client, tokens.acme, "slow", 1)
        await until_offered(pool, "slow")
        direct = client.server.app[PLANE].direct

        async def in_flight(count: int) -> bool:
            return sum(direct._in_flight.values()) == count

        # Alone on a replica with no call in flight: run at once, a batch of one.
        status, task = await predict(client, tokens.acme, "slow", [0])
        assert (status, task["outputs"]) == (200, [1])
        # Five sent while a call runs wait for it, then leave in batches of at most three:
        # the first three full; the two left once the full batch's call ends, their window
        # having passed during it.
        first = asyncio.create_task(predict(client, tokens.acme, "slow", [0]))
        await eventually(lambda: in_flight(1))
        await asyncio.sleep(0.5)  # its batch left at once: the replica is in its call
        during = await asyncio.gather(
            *(predict(client, tokens.acme, "slow", [0]) for _ in range(5))
        )
        assert (await first)[1]["outputs"] == [1]
        assert sorted(body["outputs"] for _, body in during) == [[2], [2], [3], [3], [3]]
        await client.get("/v1/deployments/slow/metrics", headers=auth(tokens.acme))  # flushed
        batches = await pool.fetch("SELECT tasks, items, reason FROM serving_batches")
        assert sorted(tuple(b) for b in batches) == [
            (1, 1, "idle"),
            (1, 1, "idle"),
            (2, 2, "timeout"),
            (3, 3, "full"),
        ]
        response = await client.get("/v1/deployments/slow/metrics", headers=auth(tokens.acme))
        figures = (await response.json())["batches"]
        assert (figures["full"], figures["timeout"], figures["idle"]) == (1, 1, 2)
        assert (figures["count"], figures["items"], figures["max_size"]) == (4, 7, 3)


async def test_a_request_whose_client_went_away_never_reaches_the_replica(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path, as_deployed=True) as (client, _):
        await publish(client, tokens.acme, "slow", slow_sizes(3), "slow:predict")
        serving = {"max_batch_size": 3, "max_wait_ms": 10, "memo": False}
        await deploy(client, tokens.acme, name="slow", model="slow", serving=serving)
        await until_running(client, tokens.acme, "slow", 1)
        await until_offered(pool, "slow")
        direct = client.server.app[PLANE].direct

        async def in_flight(count: int) -> bool:
            return sum(direct._in_flight.values()) == count

        # A call holds the replica for 3 s: requests sent meanwhile wait for it.
        first = asyncio.create_task(predict(client, tokens.acme, "slow", [0]))
        await eventually(lambda: in_flight(1))
        await asyncio.sleep(0.5)  # its batch left at once: the replica is in its call
        # One goes away while it waits for the next batch (sent, then 0.3 s at the agent,
        # which loopback takes in far less).
        gone = asyncio.create_task(predict(client, tokens.acme, "slow", [0]))
        await eventually(lambda: in_flight(2))
        await asyncio.sleep(0.3)
        gone.cancel()  # the client closes its connection
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        await eventually(lambda: in_flight(1))  # the control plane closed its request
        # The agent sees it gone within the 200 ms promised (before, the next batch may still
        # take it: the agent looks every gone_clients.GONE_POLL_S).
        await asyncio.sleep(0.2)
        # Two more, during the same call: the next batch is theirs alone (with the one that
        # went away, each would see 3).
        during = await asyncio.gather(
            *(predict(client, tokens.acme, "slow", [0]) for _ in range(2))
        )
        assert [(status, body["outputs"]) for status, body in during] == [(200, [2])] * 2
        assert (await first)[1]["outputs"] == [1]
        await client.get("/v1/deployments/slow/metrics", headers=auth(tokens.acme))  # flushed
        # Counted: the three answered requests, and the replica's calls of 1 and 2 items;
        # nothing of the one that went away (no answer, no item run).
        assert await pool.fetchval("SELECT count(*) FROM serving_tasks") == 3
        batches = await pool.fetch("SELECT tasks, items FROM serving_batches ORDER BY at")
        assert [tuple(b) for b in batches] == [(1, 1), (2, 2)]


async def test_a_call_already_running_finishes_its_answer_dropped(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path, as_deployed=True) as (client, _):
        await publish(client, tokens.acme, "slow", SLOW_SIZES, "slow:predict")
        serving = {"max_batch_size": 2, "max_wait_ms": 10, "memo": False}
        await deploy(client, tokens.acme, name="slow", model="slow", serving=serving)
        await until_running(client, tokens.acme, "slow", 1)
        channel = await until_offered(pool, "slow")
        direct = client.server.app[PLANE].direct

        async def in_flight(count: int) -> bool:
            return sum(direct._in_flight.values()) == count

        gone = asyncio.create_task(predict(client, tokens.acme, "slow", [0]))
        await eventually(lambda: in_flight(1))
        await asyncio.sleep(0.4)  # its batch left after 10 ms: the replica is in its call
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        # The control plane lets go at once; the replica's call runs on (never interrupted).
        await eventually(lambda: in_flight(0), seconds=0.5)
        status, task = await predict(client, tokens.acme, "slow", [0])
        # The same replica, after the call, alone in its batch (the other's item not run again).
        assert (status, task["outputs"]) == (200, [1])
        assert task["times"]["steps"][0]["replica"] == str(channel["replica"])
        await client.get("/v1/deployments/slow/metrics", headers=auth(tokens.acme))  # flushed
        # Only the answered request is counted; the call whose every request went away carried
        # its figures to no one, so no batch row has it (as the user guide says).
        assert await pool.fetchval("SELECT count(*) FROM serving_tasks") == 1
        batches = await pool.fetch("SELECT tasks, items FROM serving_batches")
        assert [tuple(b) for b in batches] == [(1, 1)]
