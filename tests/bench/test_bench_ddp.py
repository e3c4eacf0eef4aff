"""`trainyard bench ddp`, small: a two-learner job meets, a rank's SIGKILL stops its attempt
within the target, and the restarted job ends with the weights of one never stopped, having
redone no more than a checkpoint interval (its figures are for docs/performance.md, not for this
test, which asserts only what must hold on any machine)."""

from __future__ import annotations

from pathlib import Path

from tests.bench.cli import bench


def test_two_learners_meet_fail_together_and_resume_exactly(tmp_path: Path) -> None:
    # No database: the benchmark's agent runs on the agent port's in-memory twin.
    result = bench("postgresql://unused", tmp_path, "ddp", "--steps", "30")
    assert result["resume_exact"] == 1
    assert result["restarts"] == 1
    assert 0 <= result["lost_steps"] <= result["settings"]["checkpoint_every"]
    assert 0 < result["rank_failure_stop_s"] <= 5
    assert 0 < result["rendezvous_wait_s"] <= result["rendezvous_s"]
    assert result["scaling_efficiency"] > 0
