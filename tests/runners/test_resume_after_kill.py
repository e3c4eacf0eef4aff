"""The example job through the launcher: killed, preempted or poked mid-training, then restarted,
it resumes from its checkpoint and ends exactly like a run that was never interrupted."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from learner_process import CLASSIFIER, LAUNCH, Learner, StartLearner, learner_env

from runners.config import (
    CHECKPOINT_DIR,
    CHECKPOINT_INTERVAL,
    CHECKPOINT_KEEP,
    RESULTS_DIR,
    RESUME_FROM,
)
from runners.protocol import CheckpointRestored, CheckpointSaved, Message, Metric

JOB = (*LAUNCH, *CLASSIFIER, "--seed", "7", "--steps", "4000")


@dataclass(frozen=True)
class Outcome:
    losses: dict[int, float]  # training loss reported at each logged step
    result: dict[str, Any]  # the job's result.json
    model: dict[str, torch.Tensor]  # the job's model.pt


def outcome(learner: Learner, job: Path) -> Outcome:
    return Outcome(
        losses={m.step: m.values["loss"] for m in learner.messages if is_training_metric(m)},
        result=json.loads((job / "results" / "result.json").read_text()),
        model=torch.load(job / "results" / "model.pt", weights_only=True),
    )


def is_training_metric(message: Message) -> bool:
    return isinstance(message, Metric) and "loss" in message.values


def reported_step(message: Message) -> int:
    assert isinstance(message, Metric)
    return message.step


def job_env(job: Path, **variables: str) -> dict[str, str | Path]:
    return {CHECKPOINT_DIR: job / "checkpoints", RESULTS_DIR: job / "results", **variables}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    """The same job, run once from start to end without interruption."""
    job = tmp_path_factory.mktemp("uninterrupted")
    learner = Learner(JOB, learner_env(job_env(job)), job / "stderr.txt")
    try:
        assert learner.finish() == 0, learner.output()
        yield outcome(learner, job)
    finally:
        learner.kill_all()


def assert_same_ending(resumed: Outcome, reference: Outcome, restored_step: int) -> None:
    # Every loss the resumed run reported matches the uninterrupted run's at the same step...
    assert resumed.losses == {
        step: loss for step, loss in reference.losses.items() if step > restored_step
    }
    # ...and so do the final loss and the trained weights.
    assert resumed.result["final_loss"] == pytest.approx(reference.result["final_loss"], rel=1e-6)
    assert resumed.result["accuracy"] == reference.result["accuracy"]
    assert resumed.model.keys() == reference.model.keys()
    for name, weights in resumed.model.items():
        torch.testing.assert_close(weights, reference.model[name], rtol=1e-6, atol=1e-7)


def test_a_learner_killed_mid_training_resumes_from_its_last_reported_checkpoint(
    start_learner: StartLearner, tmp_path: Path, uninterrupted: Outcome
) -> None:
    # Periodic checkpoints every 0.2 s; keep them all, so that whichever was reported last is
    # still there to resume from, however many the learner saved before it was killed.
    env = job_env(tmp_path, **{CHECKPOINT_INTERVAL: "0.2", CHECKPOINT_KEEP: "1000"})
    crashed = start_learner(JOB, env)
    crashed.wait_for(lambda m: isinstance(m, CheckpointSaved))

    crashed.kill_all()  # launcher and trainer, as a node crash or `docker kill` would

    # It really died mid-training: PROCESSING never ended, no result was written.
    assert "PROCESSING" not in crashed.phase_ends()
    assert not (tmp_path / "results" / "result.json").exists()
    last = [m for m in crashed.messages if isinstance(m, CheckpointSaved)][-1]
    assert 0 < last.step < 4000

    resumed = start_learner(JOB, {**env, RESUME_FROM: last.path})

    assert resumed.finish() == 0, resumed.output()
    restored = [m for m in resumed.messages if isinstance(m, CheckpointRestored)]
    assert [(m.step, m.path) for m in restored] == [(last.step, last.path)]
    resumed_outcome = outcome(resumed, tmp_path)
    # Training went on from the checkpoint's step, not from zero.
    assert min(resumed_outcome.losses) > last.step
    assert_same_ending(resumed_outcome, uninterrupted, last.step)


def test_a_learner_checkpoints_on_request_and_on_preemption_then_resumes(
    start_learner: StartLearner, tmp_path: Path, uninterrupted: Outcome
) -> None:
    env = job_env(tmp_path)  # the default interval is far longer than this job
    learner = start_learner(JOB, env)
    learner.wait_for(is_training_metric)  # in the training loop, with its handlers in place

    learner.process.send_signal(signal.SIGUSR1)
    requested = learner.wait_for(lambda m: isinstance(m, CheckpointSaved))
    assert isinstance(requested, CheckpointSaved)
    # The request did not stop training.
    learner.wait_for(lambda m: is_training_metric(m) and reported_step(m) > requested.step)

    learner.process.send_signal(signal.SIGTERM)

    assert learner.finish() == 128 + signal.SIGTERM
    preempted = [m for m in learner.messages if isinstance(m, CheckpointSaved)][-1]
    assert requested.step < preempted.step < 4000
    assert learner.phase_ends()["PROCESSING"].outcome == "interrupted"

    # Restarted without TRAINYARD_RESUME_FROM: it picks the newest checkpoint itself.
    resumed = start_learner(JOB, env)

    assert resumed.finish() == 0, resumed.output()
    restored = [m for m in resumed.messages if isinstance(m, CheckpointRestored)]
    assert [(m.step, m.path) for m in restored] == [(preempted.step, preempted.path)]
    assert_same_ending(outcome(resumed, tmp_path), uninterrupted, preempted.step)
