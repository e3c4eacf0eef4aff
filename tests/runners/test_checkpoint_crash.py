"""A process killed at an arbitrary moment of saving leaves only checkpoints that verify."""

from __future__ import annotations

import io
import textwrap
import time
from pathlib import Path

import pytest
import torch
from learner_process import PYTHON, StartLearner

from runners.channel import Channel
from runners.checkpoint import Checkpointer, verify
from runners.protocol import CheckpointSaved

SIZE = 4 * 1024 * 1024  # floats: 16 MiB per checkpoint, so that a kill often lands mid-save

# Saves checkpoints of a tensor filled with the step number, as fast as it can, forever.
WRITER = f"""
import sys, torch
from runners.checkpoint import Checkpointer

class Blob:
    def __init__(self):
        self.tensor = torch.zeros({SIZE})
    def state_dict(self):
        return {{"tensor": self.tensor}}
    def load_state_dict(self, state):
        self.tensor = state["tensor"]

blob = Blob()
checkpointer = Checkpointer(sys.argv[1], {{"blob": blob}}, keep=2)
step = 0
while True:
    step += 1
    blob.tensor.fill_(step)
    checkpointer.save(step)
"""


class Blob:
    def __init__(self) -> None:
        self.tensor = torch.zeros(SIZE)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"tensor": self.tensor}

    def load_state_dict(self, state: dict[str, torch.Tensor], /) -> None:
        self.tensor = state["tensor"]


@pytest.mark.parametrize("delay_s", [0.0, 0.04, 0.15])
def test_a_saver_killed_at_any_moment_leaves_only_valid_checkpoints(
    start_learner: StartLearner, tmp_path: Path, delay_s: float
) -> None:
    writer = start_learner((PYTHON, "-c", textwrap.dedent(WRITER), str(tmp_path)))
    for _ in range(2):
        writer.wait_for(lambda m: isinstance(m, CheckpointSaved))
    # Where the kill lands varies with the delay; what must hold does not.
    time.sleep(delay_s)

    writer.kill_all()

    reported = [m.step for m in writer.messages if isinstance(m, CheckpointSaved)]
    for manifest in tmp_path.glob("ckpt-*.json"):
        verify(manifest.with_suffix(".pt"))  # raises if a manifest vouches for a bad file
    blob = Blob()
    step = Checkpointer(tmp_path, {"blob": blob}, channel=Channel(io.StringIO())).resume()
    assert step >= max(reported)
    assert torch.equal(blob.tensor, torch.full((SIZE,), float(step)))
