"""Switching the claim policy on a real Postgres: the operator's SchedulingPolicySet event, the
`scheduling` projection's row, and the claims that follow it from the next claim on. Under
fifo an old low-priority job goes before a new high-priority one; with quotas off a tenant
takes more than its quota; under fair share the tenant holding less goes first, as before."""

from __future__ import annotations

from uuid import UUID, uuid4

import asyncpg
import pytest

from controlplane.agents.claims import claim
from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import Nodes, NodeSpec
from controlplane.jobs.manifest import JobManifest
from controlplane.queries import Q
from controlplane.scheduling.application import Scheduling, policy_in_force
from controlplane.scheduling.events import SchedulingPolicySet
from controlplane.scheduling.policy import DEFAULT, ClaimPolicy, Order
from controlplane.scheduling.requests import PolicyRequest
from controlplane.scheduling.streams import POLICY_STREAM
from controlplane.tenants.service import create_tenant, update_tenant
from tests.cluster import USER, Plane

AGENT = uuid4()


async def node(plane: Plane, gpus: int) -> None:
    """Node n1 with `gpus` GPUs (registered again: with more, those allocated stay so)."""
    offered = [
        GpuInfo(index=k, uuid=f"GPU-n1-{k}", model="fake", memory_mb=1024, healthy=True)
        for k in range(gpus)
    ]
    spec = NodeSpec("n1", AGENT, "process", 16, 65536, offered)
    await Nodes(plane.pool, plane.store).register(spec, ttl_s=60)


async def submit(plane: Plane, tenant: str, priority: int = 0) -> UUID:
    manifest = JobManifest.model_validate(
        {
            "name": "t",
            "image": "img",
            "command": ["train"],
            "gpus_per_learner": 1,
            "priority": priority,
        }
    )
    job, _ = await plane.jobs.submit(tenant, manifest, USER.model_copy(update={"tenant": tenant}))
    return job.job_id


async def queued(plane: Plane) -> None:
    """The queue (a projection) holds every job submitted so far."""
    await plane.projected()


async def switch(plane: Plane, policy: ClaimPolicy) -> bool:
    scheduling = Scheduling(plane.pool, plane.store, plane.runner)
    view = await scheduling.set_policy(
        PolicyRequest(order=policy.order, quotas=policy.quotas), "admin"
    )
    assert (view.order, view.quotas) == (policy.order, policy.quotas)
    return bool(view.changed)


async def claimed(plane: Plane, limit: int = 8) -> list[UUID]:
    return [won.job.job_id for won in await claim(plane.pool, plane.store, "n1", limit=limit)]


async def candidates(plane: Plane) -> list[UUID]:
    """What a claim by n1 would take now, in order: a look only (rolled back)."""
    async with plane.pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        try:
            return [r["job_id"] for r in await conn.fetch(Q["claim_candidates"], "n1", 8)]
        finally:
            await transaction.rollback()


async def test_the_switch_is_recorded_projected_and_read_back(
    plane: Plane, owner: asyncpg.Connection
) -> None:
    scheduling = Scheduling(plane.pool, plane.store, plane.runner)
    before = await scheduling.policy()
    assert (before.order, before.quotas, before.set_by) == (Order.FAIR_SHARE, True, None)
    assert await policy_in_force(plane.pool) == DEFAULT
    # The default is in force already: nothing to record.
    assert not await switch(plane, DEFAULT)
    assert await plane.store.read_stream(POLICY_STREAM) == []

    fifo = ClaimPolicy(Order.FIFO, quotas=False)
    assert await switch(plane, fifo)
    assert not await switch(plane, fifo)
    [recorded] = await plane.store.read_stream(POLICY_STREAM)
    assert isinstance(recorded.event, SchedulingPolicySet)
    assert (recorded.event.policy, recorded.event.actor) == (fifo, "admin")
    assert await policy_in_force(plane.pool) == fifo
    after = await scheduling.policy()
    assert (after.set_by, after.set_at) == ("admin", recorded.event.at)

    # A rebuild replays the stream into the row; the auditor sees the switch.
    await plane.runner.rebuild("scheduling")
    assert await policy_in_force(plane.pool) == fifo
    actions = await owner.fetch(
        "SELECT action, actor FROM audit.actions WHERE event_type = 'SchedulingPolicySet'"
    )
    assert [tuple(a) for a in actions] == [("scheduling_policy_set", "admin")]


async def test_under_fifo_an_old_low_priority_job_goes_before_a_new_high_priority_one(
    plane: Plane,
) -> None:
    await node(plane, 1)
    old = await submit(plane, "acme", priority=-1)
    new = await submit(plane, "acme", priority=5)
    await queued(plane)
    assert await candidates(plane) == [new]  # fair share: priority decides within a tenant
    await switch(plane, ClaimPolicy(Order.FIFO))
    assert await claimed(plane) == [old]


async def test_under_priority_the_highest_goes_first_across_tenants(plane: Plane) -> None:
    await create_tenant(plane.store, plane.runner, "globex", actor="test")
    await node(plane, 1)
    await submit(plane, "acme")
    await queued(plane)
    assert len(await claimed(plane)) == 1  # acme holds the GPU
    await node(plane, 2)
    low = await submit(plane, "globex")
    high = await submit(plane, "acme", priority=3)
    await queued(plane)
    assert await candidates(plane) == [low, high]  # fair share: globex holds nothing
    await switch(plane, ClaimPolicy(Order.PRIORITY))
    assert await claimed(plane, limit=1) == [high]


@pytest.mark.parametrize("quotas", [True, False])
async def test_with_quotas_off_a_tenant_takes_more_than_its_quota(
    plane: Plane, quotas: bool
) -> None:
    await update_tenant(plane.store, plane.runner, "acme", gpu_quota=1, actor="test")
    await node(plane, 2)
    jobs = [await submit(plane, "acme"), await submit(plane, "acme")]
    await queued(plane)
    await switch(plane, ClaimPolicy(Order.FAIR_SHARE, quotas=quotas))
    assert sorted(await claimed(plane)) == sorted(jobs[:1] if quotas else jobs)


async def test_under_fair_share_the_tenant_holding_less_goes_first(plane: Plane) -> None:
    await create_tenant(plane.store, plane.runner, "globex", actor="test")
    await node(plane, 1)
    await submit(plane, "acme")
    await queued(plane)
    assert len(await claimed(plane)) == 1  # acme holds the GPU
    await node(plane, 2)
    acme = await submit(plane, "acme", priority=9)
    globex = await submit(plane, "globex")
    await queued(plane)
    await switch(plane, ClaimPolicy(Order.FIFO))
    assert await candidates(plane) == [acme, globex]
    await switch(plane, DEFAULT)  # and back: fair share as before
    assert await candidates(plane) == [globex, acme]
    assert await claimed(plane, limit=1) == [globex]
