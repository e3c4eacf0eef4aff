"""A replica's share of its node's CPUs, through a real root agent and its sandbox: while it
loads its model its cgroup has no CPU quota; once loaded, its job's CPUs and a loaded
replica's low weight (`node_agent.runtime.CpuShare`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.processes import find_learners
from node_agent.cgroups import Cgroup
from node_agent.sandbox import Sandbox, cgroup_name
from tests.controlplane.deployments.serving import publish, serving_cluster
from tests.controlplane.inference.test_inference import SUMS, submit, until_state
from tests.node_agent.test_sandbox import LOADED, cpu_of
from tests.polling import eventually
from tests.tenancy import Tokens, auth

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only an agent that is root sandboxes")

SLOW_TO_LOAD = SUMS + b"\nimport time\n\ntime.sleep(3)\n"


async def test_a_replica_loads_without_a_cpu_quota_and_serves_within_its_own(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, [agent]):
        await publish(client, tokens.acme, "slow-load", SLOW_TO_LOAD, "slow_load:predict")
        job = await submit(
            client,
            tokens.acme,
            name="shares",
            model="slow-load",
            input={"generate": {"shape": [4], "seed": 1}},
            batch_size=2,
            replicas=1,
            resources={"cpus": 0.5},
        )
        seen: list[tuple[str, float]] = []

        def replica_group() -> Cgroup | None:
            found = find_learners(agent.config.name, agent.config.work_dir)
            names = [cgroup_name(f.job_id, f.attempt, f.learner, f.epoch) for f in found]
            return Sandbox.open().cgroups.group(names[0]) if names else None

        async def shared(expected: tuple[str, float]) -> bool:
            group = replica_group()
            if group is None or not group.exists():
                return False
            seen.append(cpu_of(group))
            return seen[-1] == expected

        await eventually(lambda: shared(("max", 1.0)), seconds=60)  # loading: no quota
        await eventually(lambda: shared(("50000", LOADED)), seconds=60)  # loaded
        response = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(tokens.acme))
        assert response.status == 200, await response.text()
        await until_state(client, tokens.acme, job["id"], "CANCELLED")
