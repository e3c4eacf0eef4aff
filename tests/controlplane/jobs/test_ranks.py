"""A job's ranks (`controlplane.jobs.ranks`), folded from the job its commands leave, and as
the job's view carries them."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

import pytest

from controlplane.jobs.lifecycle import (
    Command,
    Complete,
    Deploy,
    EnterPhase,
    Fail,
    Job,
    JobStatus,
    Refused,
    Restart,
    Submit,
    decide,
    evolve,
)
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.ranks import Rank, ranks
from controlplane.jobs.views import JobView

S = JobStatus
AT = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
GPUS = [f"GPU-{n}" for n in range(6)]


def submitted(learners: int, gpus_per_learner: int = 2) -> Job:
    manifest = JobManifest(
        name="ddp",
        image="trainer:1",
        command=["train"],
        learners=learners,
        gpus_per_learner=gpus_per_learner,
    )
    return run(None, Submit(UUID(int=7), "acme", manifest, AT))


def run(job: Job | None, *commands: Command) -> Job:
    for command in commands:
        for event in decide(command, job):
            job = evolve(job, event)
    assert job is not None
    return job


def rows(job: Job) -> list[tuple[int, str | None, list[str], JobStatus, int | None]]:
    return [(r.rank, r.node, r.gpus, r.state, r.exit_code) for r in ranks(job)]


def test_a_queued_job_has_a_rank_per_learner_placed_nowhere() -> None:
    assert rows(submitted(2)) == [(0, None, [], S.QUEUED, None), (1, None, [], S.QUEUED, None)]


def test_on_one_node_each_rank_has_the_node_and_its_own_gpus_phase_and_exit() -> None:
    job = run(
        submitted(3),
        Deploy(["node-a"], GPUS, epoch=1, at=AT),
        EnterPhase(S.PROCESSING, AT),
        EnterPhase(S.STORING, AT, learners=(1,)),
        Complete([0], AT, learners=(2,)),
    )
    assert job.state is S.PROCESSING
    assert rows(job) == [
        (0, "node-a", ["GPU-0", "GPU-1"], S.PROCESSING, None),
        (1, "node-a", ["GPU-2", "GPU-3"], S.STORING, None),
        (2, "node-a", ["GPU-4", "GPU-5"], S.COMPLETED, 0),
    ]
    # A rank that failed ends the job: the ranks still running end with it, the one that
    # completed stays so.
    failed = run(job, Fail("rank 0 exited with 1", AT, exit_code=1))
    assert [(r.state, r.exit_code) for r in ranks(failed)] == [
        (S.FAILED, None),
        (S.FAILED, None),
        (S.COMPLETED, 0),
    ]
    assert [r.node for r in ranks(failed)] == ["node-a"] * 3


def test_across_two_nodes_each_rank_has_its_node_and_gpus() -> None:
    job = run(
        submitted(3),
        Deploy(
            ["node-a", "node-b"],
            GPUS,
            epoch=1,
            at=AT,
            learner_nodes=["node-a", "node-a", "node-b"],
        ),
        EnterPhase(S.DOWNLOADING, AT, learners=(0, 1)),
    )
    assert job.state is S.DEPLOYING  # rank 2 (on node-b) has not started yet
    assert rows(job) == [
        (0, "node-a", ["GPU-0", "GPU-1"], S.DOWNLOADING, None),
        (1, "node-a", ["GPU-2", "GPU-3"], S.DOWNLOADING, None),
        (2, "node-b", ["GPU-4", "GPU-5"], S.DEPLOYING, None),
    ]


def test_a_node_s_learners_done_before_another_node_s_started_still_complete_the_job() -> None:
    """node-a's ranks ran and exited 0 while node-b's had not started (the job still
    DEPLOYING): their news is kept, and the job completes once node-b's exit too. Refused, it
    was lost, and the job stayed PROCESSING for ever (found by the learners_per_node work)."""
    job = run(
        submitted(3),
        Deploy(
            ["node-a", "node-b"],
            GPUS,
            epoch=1,
            at=AT,
            learner_nodes=["node-a", "node-a", "node-b"],
        ),
        EnterPhase(S.PROCESSING, AT, learners=(0, 1)),
        Complete([0, 0], AT, learners=(0, 1)),
    )
    assert (job.state, job.exited) == (S.DEPLOYING, [0, 1])
    # A learner that never started cannot have completed.
    with pytest.raises(Refused, match=r"learners \[2\] never started"):
        decide(Complete([0], AT, learners=(2,)), job)
    job = run(job, EnterPhase(S.DOWNLOADING, AT, learners=(2,)))
    assert job.state is S.DOWNLOADING  # the exited ranks hold it back no more
    job = run(job, EnterPhase(S.PROCESSING, AT, learners=(2,)), Complete([0], AT, learners=(2,)))
    assert job.state is S.COMPLETED
    assert [r.state for r in ranks(job)] == [S.COMPLETED] * 3


def test_an_attempt_placed_before_learners_nodes_were_recorded_has_no_node_per_rank() -> None:
    # Its JobDeploying names the nodes alone: which rank runs where is not known.
    job = run(submitted(2), Deploy(["node-a", "node-b"], GPUS[:4], epoch=1, at=AT))
    assert [rank.node for rank in ranks(job)] == [None, None]


def test_a_completed_job_has_every_rank_completed_with_exit_code_0() -> None:
    job = run(
        submitted(2, gpus_per_learner=0),
        Deploy(["node-a"], [], epoch=1, at=AT),
        EnterPhase(S.PROCESSING, AT),
        Complete([0], AT, learners=(0,)),
        Complete([0], AT, learners=(1,)),
    )
    assert job.state is S.COMPLETED
    assert rows(job) == [(0, "node-a", [], S.COMPLETED, 0), (1, "node-a", [], S.COMPLETED, 0)]


def test_a_restart_gives_the_new_attempt_ranks_placed_nowhere() -> None:
    job = run(
        submitted(2),
        Deploy(["node-a"], GPUS[:4], epoch=1, at=AT),
        EnterPhase(S.PROCESSING, AT),
        Complete([0], AT, learners=(1,)),
        Restart("node-a was lost", AT),
    )
    assert (job.state, job.attempt) == (S.QUEUED, 2)
    assert rows(job) == [(0, None, [], S.QUEUED, None), (1, None, [], S.QUEUED, None)]


def test_the_view_carries_the_ranks_in_its_json() -> None:
    job = run(submitted(2), Deploy(["node-a"], GPUS[:4], epoch=1, at=AT))
    view = JobView(**dict(job), unschedulable_reason=None)
    assert view.ranks == ranks(job)
    shown = view.model_dump(mode="json", by_alias=True)["ranks"]
    assert shown[1] == {
        "rank": 1,
        "node": "node-a",
        "gpus": ["GPU-2", "GPU-3"],
        "state": "DEPLOYING",
        "exit_code": None,
    }
    # Read back (the SDK's way), the view keeps them.
    assert JobView.model_validate_json(view.model_dump_json(by_alias=True)).ranks == [
        Rank.model_validate(r) for r in view.model_dump(mode="json")["ranks"]
    ]
