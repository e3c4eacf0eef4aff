"""The checkpointer, in process: what a checkpoint holds, which checkpoint counts, how many are
kept, and when one is taken."""

from __future__ import annotations

import io
import json
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from runners.channel import Channel
from runners.checkpoint import (
    Checkpointer,
    CheckpointError,
    Stateful,
    data_path,
    manifest_path,
)
from runners.durable import sha256_file
from runners.protocol import CheckpointRestored, CheckpointSaved, Message, parse


class Training:
    """A tiny training run whose every step draws from torch's and Python's RNGs."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        random.seed(seed)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)

    def state(self) -> dict[str, Stateful]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def step(self) -> tuple[float, float]:
        inputs = torch.randn(8, 4) * random.random()
        loss = self.model(inputs).pow(2).mean()  # and dropout draws from torch's RNG
        self.optimizer.zero_grad()
        torch.autograd.backward(loss)
        self.optimizer.step()
        self.scheduler.step()
        return loss.item(), random.random()


class Reports:
    """A channel whose lines the test reads back."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.channel = Channel(self.stream)

    def messages(self) -> list[Message | None]:
        return [parse(line) for line in self.stream.getvalue().splitlines()]


def checkpointer(directory: Path, training: Training, **options: Any) -> Checkpointer:
    """A checkpointer of `training` whose reports nobody reads."""
    return Checkpointer(directory, training.state(), channel=Reports().channel, **options)


def names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def test_restoring_continues_exactly_where_the_save_left_off(tmp_path: Path) -> None:
    original = Training(seed=1)
    for _ in range(5):
        original.step()
    checkpointer(tmp_path, original).save(step=5)
    expected = [original.step() for _ in range(4)]

    # A restarted process: fresh weights and different RNG states until the restore.
    resumed = Training(seed=2)
    step = checkpointer(tmp_path, resumed).resume()

    assert step == 5
    assert [resumed.step() for _ in range(4)] == expected
    for kept, restored in zip(
        original.model.state_dict().values(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(kept, restored)
    assert resumed.scheduler.get_last_lr() == original.scheduler.get_last_lr()


def test_numpy_global_generator_is_restored_when_numpy_is_installed(tmp_path: Path) -> None:
    # numpy is optional for the runners (torch does not need it), so is this test.
    np = pytest.importorskip("numpy")
    training = Training(seed=1)
    np.random.seed(1)
    checkpointer(tmp_path, training).save(step=1)
    expected = np.random.rand(4)

    np.random.seed(2)
    checkpointer(tmp_path, training).resume()

    assert np.array_equal(np.random.rand(4), expected)


def test_saving_and_restoring_are_reported(tmp_path: Path) -> None:
    reports = Reports()
    saver = Checkpointer(tmp_path, Training(seed=1).state(), channel=reports.channel)

    info = saver.save(step=3)
    saver.restore(info.path)

    saved, restored = reports.messages()
    assert isinstance(saved, CheckpointSaved)
    assert (saved.step, saved.path) == (3, str(info.path))
    assert saved.size_bytes == info.path.stat().st_size
    assert saved.sha256 == sha256_file(info.path)
    manifest = json.loads(manifest_path(info.path).read_text())
    assert (manifest["step"], manifest["sha256"], manifest["size_bytes"]) == (
        3,
        saved.sha256,
        saved.size_bytes,
    )
    assert isinstance(restored, CheckpointRestored)
    assert (restored.step, restored.path) == (3, str(info.path))


def _remove_manifest(data: Path) -> None:
    manifest_path(data).unlink()


def _remove_data(data: Path) -> None:
    data.unlink()


def _truncate_data(data: Path) -> None:
    content = data.read_bytes()
    data.write_bytes(content[: len(content) // 2])


def _flip_a_byte(data: Path) -> None:
    content = bytearray(data.read_bytes())
    content[len(content) // 2] ^= 0xFF
    data.write_bytes(bytes(content))


def _tear_manifest(data: Path) -> None:
    manifest = manifest_path(data)
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2])


@pytest.mark.parametrize(
    "damage",
    [_remove_manifest, _remove_data, _truncate_data, _flip_a_byte, _tear_manifest],
    ids=["no-manifest", "no-data", "truncated", "bit-flip", "torn-manifest"],
)
def test_latest_skips_a_partial_or_corrupt_newest_checkpoint(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    training = Training(seed=1)
    saver = checkpointer(tmp_path, training, keep=5)
    older = saver.save(step=1)
    newest = saver.save(step=2)

    damage(newest.path)

    assert saver.latest() == older
    assert checkpointer(tmp_path, Training(seed=3)).resume() == 1


def test_with_no_valid_checkpoint_training_starts_from_zero(tmp_path: Path) -> None:
    saver = checkpointer(tmp_path, Training(seed=1))
    _flip_a_byte(saver.save(step=1).path)
    reports = Reports()

    step = Checkpointer(tmp_path, Training(seed=1).state(), channel=reports.channel).resume()

    assert step == 0
    assert reports.messages() == []


def test_a_requested_checkpoint_that_does_not_verify_is_an_error(tmp_path: Path) -> None:
    saver = checkpointer(tmp_path, Training(seed=1), keep=5)
    requested = saver.save(step=1)
    saver.save(step=2)
    _truncate_data(requested.path)

    resumer = checkpointer(tmp_path, Training(seed=1), resume_from=requested.path)

    with pytest.raises(CheckpointError, match="its manifest says"):
        resumer.resume()


def test_a_checkpoint_of_differently_shaped_state_is_refused(tmp_path: Path) -> None:
    info = checkpointer(tmp_path, Training(seed=1)).save(step=1)
    model_only = Checkpointer(tmp_path, {"model": Training(seed=1).model})

    with pytest.raises(CheckpointError, match=r"holds state for \['model', 'optimizer'"):
        model_only.restore(info.path)


def test_only_the_newest_k_checkpoints_are_kept(tmp_path: Path) -> None:
    saver = checkpointer(tmp_path, Training(seed=1), keep=2)

    for step in range(1, 6):
        saver.save(step=step * 10)

    assert names(tmp_path) == [
        "ckpt-00000004.json",
        "ckpt-00000004.pt",
        "ckpt-00000005.json",
        "ckpt-00000005.pt",
    ]


def test_leftovers_of_crashed_saves_are_ignored_and_then_removed(tmp_path: Path) -> None:
    saver = checkpointer(tmp_path, Training(seed=1))
    saved = saver.save(step=1)
    # What saves killed at various moments leave: a temporary data file, a temporary manifest,
    # and a data file whose manifest was never written.
    (tmp_path / ".ckpt-00000002.pt.tmp-0123456789ab").write_bytes(b"half a checkpoint")
    (tmp_path / ".ckpt-00000002.json.tmp-0123456789ab").write_text('{"form')
    data_path(tmp_path, 3).write_bytes(b"complete, but never committed")

    assert saver.latest() == saved

    saver.save(step=2)

    assert names(tmp_path) == [
        "ckpt-00000001.json",
        "ckpt-00000001.pt",
        "ckpt-00000004.json",
        "ckpt-00000004.pt",
    ]


def test_after_resuming_an_older_checkpoint_new_saves_are_the_newest(tmp_path: Path) -> None:
    saver = checkpointer(tmp_path, Training(seed=1), keep=3)
    older = saver.save(step=10)
    saver.save(step=20)

    resumed = checkpointer(tmp_path, Training(seed=1), keep=1, resume_from=older.path)
    assert resumed.resume() == 10
    newest = resumed.save(step=15)

    assert resumed.latest() == newest
    # keep=1 keeps the checkpoint just saved, not the one with the higher step.
    assert names(tmp_path) == ["ckpt-00000003.json", "ckpt-00000003.pt"]


def test_maybe_save_saves_once_per_interval(tmp_path: Path) -> None:
    now = [100.0]
    saver = checkpointer(tmp_path, Training(seed=1), interval_seconds=10.0, clock=lambda: now[0])
    saved = []

    for time, step in [(100.0, 1), (109.9, 2), (110.0, 3), (115.0, 4), (120.0, 5)]:
        now[0] = time
        info = saver.maybe_save(step)
        saved.append(None if info is None else info.step)

    assert saved == [None, None, 3, None, 5]


def test_sigusr1_asks_for_one_checkpoint_at_the_next_maybe_save(tmp_path: Path) -> None:
    saver = checkpointer(tmp_path, Training(seed=1), interval_seconds=3600.0)

    with saver:
        assert saver.maybe_save(1) is None
        os.kill(os.getpid(), signal.SIGUSR1)
        # The handler only takes note; the checkpoint waits for the training loop.
        assert list(tmp_path.iterdir()) == []
        requested = saver.maybe_save(2)
        after = saver.maybe_save(3)

    assert requested is not None and requested.step == 2
    assert after is None


def test_sigterm_saves_at_the_next_maybe_save_and_exits_as_sigterm_would(tmp_path: Path) -> None:
    saver = checkpointer(tmp_path, Training(seed=1), interval_seconds=3600.0)

    with saver:
        os.kill(os.getpid(), signal.SIGTERM)
        assert list(tmp_path.iterdir()) == []
        with pytest.raises(SystemExit) as exit_:
            saver.maybe_save(7)

    assert exit_.value.code == 128 + signal.SIGTERM
    latest = saver.latest()
    assert latest is not None and latest.step == 7


def test_leaving_the_with_block_restores_the_previous_handlers(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    saver = checkpointer(tmp_path, Training(seed=1))

    with saver:
        assert signal.getsignal(signal.SIGTERM) != before[0]

    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)) == before
