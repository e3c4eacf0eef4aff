"""A job whose learners train together across nodes: two real agents on one machine act as two
nodes, each a `trainyard agent` process in a network namespace of its own (`harness.node_pair`),
on one Postgres (by its Unix socket), with the sandboxed process runtime. The digits example in
DistributedDataParallel as a job of two learners, one on each agent, meets across the nodes
through the job's network alone (`node_agent.job_links`) and ends with the weights of one
learner over the same global batches (the example run alone, a world of one), within 1e-5."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from controlplane.jobs.lifecycle import Job, JobStatus
from harness.agent_process import AgentProcess
from harness.node_pair import NODE_ADDRESSES, in_ns, node_pair
from node_agent.learners import learner_dir
from tests.cluster import Plane, learner_space

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(p) for p in ("ip", "iptables", "bwrap")),
    reason="two agents as two nodes need root, ip, iptables and bubblewrap (the sandbox)",
)

STEPS = 12


def command() -> list[str]:
    return [
        *(sys.executable, "-m", "runners.examples.digits_ddp", "--seed", "3"),
        *("--steps", str(STEPS), "--global-batch", "64", "--checkpoint-every", "6"),
        *("--device", "cpu", "--weights", "weights.pt"),
    ]


def ended(job: Job) -> bool:
    return job.state in (JobStatus.COMPLETED, JobStatus.FAILED)


def weights(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def rank_0_weights(work: dict[str, Path], job: Job) -> Path:
    [path] = [
        found
        for folder in work.values()
        if (found := learner_dir(folder, job.job_id, job.attempt, 0) / "weights.pt").exists()
    ]
    return path


async def test_two_learners_on_two_agents_end_with_one_learner_s_weights(
    plane: Plane, db_url: str, tmp_path: Path
) -> None:
    space = learner_space()
    work = {node: space / node for node in NODE_ADDRESSES}
    # One learner alone, meanwhile: the example as a plain process, in a world of one.
    alone = await asyncio.create_subprocess_exec(*command(), cwd=tmp_path, env=dict(os.environ))
    with node_pair(work) as names:
        agents = [
            AgentProcess(
                db_url,
                work[node],
                f"ddp-{node}",
                # Rank 0's checkpoints, which every rank reads: a folder both nodes mount.
                checkpoint_dir=space / "checkpoints",
                fake_gpus=0,
                prefix=tuple(in_ns(names[node])),
                # One learner of a 1-CPU job each: the job spans both nodes.
                options=("--node-address", address, "--cpus", "1", "--poll", "0.2"),
            )
            for node, address in NODE_ADDRESSES.items()
        ]
        try:
            for agent in agents:
                await agent.start(plane.pool)
            together = await plane.submit(command(), learners=2, gpus_per_learner=0, cpus=1)
            two = await plane.until(together, ended, seconds=120)
            lines = await plane.log_text(together)
            assert two.state is JobStatus.COMPLETED and two.attempt == 1, lines
        finally:
            for agent in agents:
                await agent.stop()
    assert set(two.nodes) == {"ddp-a", "ddp-b"}
    assert await alone.wait() == 0
    ours, theirs = weights(rank_0_weights(work, two)), weights(tmp_path / "weights.pt")
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert torch.allclose(tensor, theirs[name], rtol=0, atol=1e-5), name
