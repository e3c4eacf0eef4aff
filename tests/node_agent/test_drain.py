"""An operator's drain, as the agent of the drained node follows it: real agents and child
processes on the port's in-memory twin. Its jobs are preempted (their learners asked to
checkpoint, then stopped; no restart spent), the agent keeps its lease and claims nothing until
the node is undrained; the job runs again elsewhere, or there once undrained. End to end on
Postgres, through the API and the CLI: tests/trainyard/test_nodes_cli.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controlplane.jobs.events import JobRestarted
from controlplane.jobs.lifecycle import JobStatus
from node_agent.attempt import drained
from tests.cluster import agent_config
from tests.node_agent.test_agent import SLEEPER, wait_for_line
from tests.node_agent.twin import Twin, TwinAgent


async def test_a_drained_node_s_jobs_go_back_to_the_queue_and_run_there_once_undrained(
    twin: Twin, tmp_path: Path
) -> None:
    agent = await TwinAgent(twin, agent_config(tmp_path), fake_gpus=1).started()
    # No restart allowed at all: a drain that spent one would fail the job.
    job_id = await twin.submit(SLEEPER, max_restarts=0)
    await twin.state(job_id, JobStatus.PROCESSING)
    await wait_for_line(twin, job_id, "ready")

    twin.port.drain("n1")
    job = await twin.state(job_id, JobStatus.QUEUED)
    assert (job.attempt, job.restarts) == (2, 0)
    assert job.transitions[-1].reason == drained("n1")
    await wait_for_line(twin, job_id, "terminating")  # SIGTERM: its grace to checkpoint
    history = [news.event for news in await twin.jobs.history(job_id)]
    [restarted] = [event for event in history if isinstance(event, JobRestarted)]
    assert restarted.preempted

    # Draining, the agent runs on and keeps its lease, but claims nothing.
    await asyncio.sleep(1.5)  # several heartbeats and polls
    assert not agent.task.done()
    queued = twin.port.job(job_id)
    assert queued is not None and queued.state is JobStatus.QUEUED
    assert await twin.port.allocations("n1") == []

    twin.port.drain("n1", draining=False)
    job = await twin.state(job_id, JobStatus.PROCESSING)
    assert (job.attempt, job.restarts, job.nodes) == (2, 0, ["n1"])
    await agent.finish()


async def test_a_drained_node_s_job_runs_elsewhere(twin: Twin, tmp_path: Path) -> None:
    first = await TwinAgent(twin, agent_config(tmp_path, name="n1"), fake_gpus=1).started()
    job_id = await twin.submit(SLEEPER)
    job = await twin.state(job_id, JobStatus.PROCESSING)
    assert job.nodes == ["n1"]
    second = await TwinAgent(twin, agent_config(tmp_path, name="n2"), fake_gpus=1).started()

    twin.port.drain("n1")
    job = await twin.until(
        job_id, lambda job: job.attempt == 2 and job.state is JobStatus.PROCESSING
    )
    assert (job.nodes, job.restarts) == (["n2"], 0)
    assert [t.reason for t in job.transitions if t.state is JobStatus.QUEUED][1:] == [drained("n1")]
    await second.finish()
    await first.finish()
