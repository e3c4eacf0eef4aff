"""Fidelity: a real run (real Postgres, the control plane's projections, a real agent with two
fake GPUs running `sleep` learners) replayed under the current policy starts the jobs in the
recorded order, at nearly the recorded times: under the default policy, and under fifo set by
the operator beforehand (the claims and the replay both follow the policy the log says)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controlplane.jobs.lifecycle import JobStatus
from controlplane.jobs.manifest import JobManifest
from controlplane.scheduling.application import Scheduling
from controlplane.scheduling.policy import DEFAULT, ClaimPolicy, Order
from controlplane.scheduling.requests import PolicyRequest
from controlplane.tenants.service import create_tenant
from sim.engine import simulate
from sim.log import read_workload
from sim.policy import NAMED, current
from sim.report import report
from tests.cluster import USER, Plane, RunningAgent, agent_config

# Each job runs at least 0.4 s longer than the one before it: the order in which two running
# jobs end never hangs on the agent's milliseconds, so the same jobs are waiting each time a
# GPU comes free, and the policy alone says which one goes.
JOBS = [
    ("acme", 0, 0.3),
    ("globex", 0, 0.7),
    ("acme", 0, 1.1),
    ("acme", 2, 1.5),
    ("globex", 0, 1.9),
    ("globex", 0, 2.3),
    ("acme", 0, 2.7),
    ("globex", 0, 3.1),
]


@pytest.mark.parametrize("policy", [DEFAULT, ClaimPolicy(Order.FIFO)], ids=str)
async def test_replaying_the_current_policy_reproduces_the_recorded_start_order(
    plane: Plane, tmp_path: Path, policy: ClaimPolicy
) -> None:
    await create_tenant(plane.store, plane.runner, "globex", 3.0, actor="test")
    if policy != DEFAULT:
        scheduling = Scheduling(plane.pool, plane.store, plane.runner)
        await scheduling.set_policy(PolicyRequest(order=policy.order), "admin")
    ids = []
    for tenant, priority, sleep_s in JOBS:
        manifest = JobManifest.model_validate(
            {
                "name": "sleep",
                "image": "img",
                "command": ["sleep", str(sleep_s)],
                "gpus_per_learner": 1,
                "priority": priority,
                "cpus": 0.1,
                "memory_mb": 64,
            }
        )
        job, _ = await plane.jobs.submit(
            tenant, manifest, USER.model_copy(update={"tenant": tenant})
        )
        ids.append(job.job_id)
    # Queued before any node is: its first claim chooses among them all, as the replay's does.
    await plane.projected()
    agent = await RunningAgent(plane.url, agent_config(tmp_path), fake_gpus=2).started()
    try:
        async with asyncio.timeout(60):
            for job_id in ids:
                await plane.state(job_id, JobStatus.COMPLETED)
    finally:
        await agent.finish()

    workload = await read_workload(plane.pool, None, None)
    assert workload.policy == policy
    outcomes = simulate(workload, current(workload.policy))
    real = [o.order for o in workload.recorded]
    assert [o.order for o in outcomes] == real
    if policy == DEFAULT:
        # The weights and the priority did decide: not the order the jobs came in.
        assert real != sorted(real)
    else:
        # Submission order alone, which fair share would not have followed.
        assert real == sorted(real)
        fair = NAMED["fair_share"]
        assert [o.order for o in simulate(workload, fair)] != real
    compared = report(workload, current(workload.policy), outcomes).comparison
    assert compared.jobs_compared == len(JOBS)
    assert compared.start_order_agreement == 1.0
    assert compared.start_time_error is not None and compared.start_time_error < 0.05
