"""What the API shows of the nodes, on a real Postgres: to an admin each GPU with what holds
it, to a tenant only whether it is taken (which job holds it is another tenant's business)."""

from __future__ import annotations

from uuid import uuid4

import asyncpg

from controlplane.agents.answers import nodes_seen
from controlplane.agents.nodes import Nodes, NodeSpec
from controlplane.events.store import EventStore
from tests.controlplane.pending.test_pending_reasons import gpus


async def test_a_tenant_sees_whether_a_gpu_is_taken_and_an_admin_by_what(
    pool: asyncpg.Pool, store: EventStore
) -> None:
    await Nodes(pool, store).register(
        NodeSpec("n1", uuid4(), "process", 8, 65536, gpus("n1", 2)), 60
    )
    holder = {"job_id", "attempt", "learner"}
    [tenants] = (await nodes_seen(pool, holders=False)).model_dump(mode="json")["nodes"]
    [admins] = (await nodes_seen(pool, holders=True)).model_dump(mode="json")["nodes"]
    assert (tenants["name"], tenants["state"], tenants["gpus_free"]) == ("n1", "READY", 2)
    assert [holder & gpu.keys() for gpu in tenants["gpus"]] == [set(), set()]
    assert [{k: gpu[k] for k in holder} for gpu in admins["gpus"]] == [dict.fromkeys(holder)] * 2
    assert [gpu["allocated"] for gpu in admins["gpus"]] == [False, False]
    assert {k: v for k, v in admins.items() if k != "gpus"} == {
        k: v for k, v in tenants.items() if k != "gpus"
    }
