"""Fixtures for tests that run learners as real processes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from learner_process import Learner, StartLearner, learner_env


@pytest.fixture
def start_learner(tmp_path: Path) -> Iterator[StartLearner]:
    """Start learners: `start_learner(command, {TRAINYARD_...: value})`; killed at teardown."""
    started: list[Learner] = []

    def start(command: Sequence[str], variables: Mapping[str, str | Path] | None = None) -> Learner:
        stderr = tmp_path / f"stderr-{len(started)}.txt"
        learner = Learner(command, learner_env(variables or {}), stderr)
        started.append(learner)
        return learner

    yield start
    for learner in started:
        learner.kill_all()
