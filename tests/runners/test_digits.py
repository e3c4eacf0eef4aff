"""The digits architecture-search example: it learns, its hyperparameters are checked, it resumes
exactly from a checkpoint (a promoted trial trains on as if it had never stopped), and as a trial
under the launcher it gets its point from the environment and `hparams.json`."""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from learner_process import LAUNCH, PYTHON, StartLearner

from runners.channel import Channel
from runners.checkpoint import Checkpointer
from runners.config import BUDGET, BUDGET_UNIT, CHECKPOINT_DIR, HPARAMS, HPARAMS_FILE, TRIAL
from runners.examples import digits
from runners.protocol import CheckpointRestored, CheckpointSaved, Metric, parse

SEED = 3
POINT: dict[str, Any] = {
    "lr": 0.01,
    "layers": [{"width": 32, "activation": "gelu"}, {"width": 16, "activation": "tanh"}],
    "dropout": 0.2,
    "batch_size": 128,
}
DIGITS = (PYTHON, "-m", "runners.examples.digits", "--seed", str(SEED))


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """As the example trains: results bit-identical to its process's. What the example's
    `main` sets, run in this process, is put back afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def trained(point: dict[str, Any], epochs: int) -> tuple[torch.nn.Module, float | None]:
    """The point trained from scratch, uninterrupted; and its last epoch's loss."""
    hparams = digits.parse(point)
    model = digits.build(hparams, SEED)
    optimizer = digits.optimizer_for(model, hparams)
    data = digits.load(SEED)
    loss = digits.train_epochs(model, optimizer, data, hparams, start=0, end=epochs, seed=SEED)
    return model, loss


def test_the_defaults_reach_095_validation_accuracy_in_20_epochs() -> None:
    model, _ = trained(digits.DEFAULTS, 20)
    assert digits.evaluate(model, digits.load(SEED)) >= 0.95


def test_the_digits_are_scikit_learn_s_read_without_importing_it() -> None:
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]

    images, labels = digits.bundled_digits()
    theirs_images, theirs_labels = load_digits(return_X_y=True)
    assert images == theirs_images.astype(int).tolist()
    assert (theirs_images == theirs_images.astype(int)).all()
    assert labels == theirs_labels.tolist()
    assert len(labels) == 1797
    loaded = "import sys; from runners.examples import digits; digits.load(0); print(sys.modules)"
    modules = subprocess.run([PYTHON, "-c", loaded], capture_output=True, text=True, check=True)
    assert "'sklearn'" not in modules.stdout and "'runners.examples.digits'" in modules.stdout


def test_the_split_and_the_weights_come_from_the_seed_alone() -> None:
    first, again, other = digits.load(1), digits.load(1), digits.load(2)
    assert torch.equal(first.valid_labels, again.valid_labels)
    assert not torch.equal(first.valid_labels, other.valid_labels)
    assert len(first.valid_labels) == digits.VALIDATION
    assert len(first.train_labels) + digits.VALIDATION == 1797
    hparams = digits.parse(POINT)
    before = torch.get_rng_state()
    built = [digits.build(hparams, 5) for _ in range(2)]
    assert all(
        torch.equal(a, b)
        for a, b in zip(built[0].state_dict().values(), built[1].state_dict().values(), strict=True)
    )
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize(
    ("point", "message"),
    [
        ({**POINT, "layers": [{"width": 8, "activation": "swish"}]}, "layers.0.activation"),
        ({**POINT, "layers": []}, "layers: List should have at least 1 item"),
        ({**POINT, "momentum": 0.9}, "momentum: Extra inputs are not permitted"),
        ({**POINT, "batch_size": "64"}, "batch_size: Input should be a valid integer"),
        ({"layers": POINT["layers"]}, "lr: Field required"),
    ],
)
def test_bad_hyperparameters_are_refused_naming_the_field(
    point: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=r"^bad hyperparameters: ") as refused:
        digits.parse(point)
    assert message in str(refused.value)


def test_training_resumed_from_a_checkpoint_equals_training_never_interrupted(
    tmp_path: Path,
) -> None:
    hparams = digits.parse(POINT)
    data = digits.load(SEED)
    quiet = Channel(io.StringIO())

    first = digits.build(hparams, SEED)
    first_optimizer = digits.optimizer_for(first, hparams)
    digits.train_epochs(first, first_optimizer, data, hparams, start=0, end=2, seed=SEED)
    Checkpointer(tmp_path, {"model": first, "optimizer": first_optimizer}, channel=quiet).save(2)

    # A fresh process's objects: built from the seed, then overwritten by the checkpoint.
    resumed = digits.build(hparams, SEED)
    optimizer = digits.optimizer_for(resumed, hparams)
    checkpointer = Checkpointer(tmp_path, {"model": resumed, "optimizer": optimizer}, channel=quiet)
    start = checkpointer.resume()
    loss = digits.train_epochs(resumed, optimizer, data, hparams, start=start, end=4, seed=SEED)

    straight, straight_loss = trained(POINT, 4)
    assert start == 2 and loss == straight_loss
    assert all(
        torch.equal(a, b)
        for a, b in zip(resumed.state_dict().values(), straight.state_dict().values(), strict=True)
    )


def in_directory(directory: Path, *command: str) -> tuple[str, ...]:
    """`command` run in `directory` (the launcher writes hparams.json in its own)."""
    return ("sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", str(directory), *command)


def test_a_promoted_trial_resumes_under_the_launcher_and_ends_as_if_never_stopped(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    trial = {
        HPARAMS: json.dumps(POINT),
        BUDGET_UNIT: "epochs",
        TRIAL: "7",
        CHECKPOINT_DIR: tmp_path / "checkpoints",
    }
    rung_0 = start_learner(in_directory(work, *LAUNCH, *DIGITS), {**trial, BUDGET: "2"})
    assert rung_0.finish() == 0, rung_0.output()
    assert json.loads((work / "hparams.json").read_text()) == POINT
    rung_1 = start_learner(in_directory(work, *LAUNCH, *DIGITS), {**trial, BUDGET: "4"})
    assert rung_1.finish() == 0, rung_1.output()

    first, then = rung_0.messages, rung_1.messages
    assert [m.step for m in first if isinstance(m, Metric)] == [1, 2]
    assert [m.step for m in first if isinstance(m, CheckpointSaved)] == [2]
    assert [m.step for m in then if isinstance(m, CheckpointRestored)] == [2]
    reports = [m for m in then if isinstance(m, Metric)]
    assert [m.step for m in reports] == [3, 4]
    assert [m.step for m in then if isinstance(m, CheckpointSaved)] == [4]
    model, loss = trained(POINT, 4)
    assert reports[-1].values == {
        "accuracy": digits.evaluate(model, digits.load(SEED)),
        "loss": loss,
    }


def test_the_launcher_gives_the_command_its_point_in_a_file(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    show = "import json, os; print(json.dumps([os.environ[n] for n in ('{0}', '{1}')]))"
    learner = start_learner(
        in_directory(tmp_path, *LAUNCH, PYTHON, "-c", show.format(HPARAMS_FILE, HPARAMS)),
        {HPARAMS: '{"lr":0.1}', BUDGET: "3", BUDGET_UNIT: "steps"},
    )
    assert learner.finish() == 0, learner.output()
    path = tmp_path / "hparams.json"
    assert json.loads(path.read_text()) == {"lr": 0.1}
    shown = next(json.loads(line) for line in learner.lines if line.startswith("["))
    assert shown == [str(path), '{"lr":0.1}']


def test_a_malformed_point_fails_the_launch_before_the_command_runs(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    learner = start_learner(
        in_directory(tmp_path, *LAUNCH, PYTHON, "-c", "print('ran')"),
        {HPARAMS: "[1, 2]", BUDGET: "3", BUDGET_UNIT: "epochs"},
    )
    assert learner.finish() == 1
    ended = learner.phase_ends()
    assert list(ended) == ["DOWNLOADING"]
    assert ended["DOWNLOADING"].error == (
        "invalid configuration: TRAINYARD_HPARAMS must be a JSON object, got list"
    )
    assert "ran\n" not in learner.lines
    assert not (tmp_path / "hparams.json").exists()


def test_a_trial_whose_budget_counts_steps_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(HPARAMS, json.dumps(POINT))
    monkeypatch.setenv(BUDGET, "100")
    monkeypatch.setenv(BUDGET_UNIT, "steps")
    with pytest.raises(SystemExit) as exited:
        digits.main([])
    assert exited.value.code == 2
    assert "this example counts epochs; the search's budget is in steps" in capsys.readouterr().err


def test_an_attempt_restarted_after_its_last_checkpoint_reports_without_training(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for name, value in {
        HPARAMS: json.dumps(POINT),
        BUDGET: "2",
        BUDGET_UNIT: "epochs",
        CHECKPOINT_DIR: str(tmp_path),
    }.items():
        monkeypatch.setenv(name, value)
    assert digits.main(["--seed", str(SEED)]) == 0
    first = [parse(line) for line in capsys.readouterr().out.splitlines()]
    assert digits.main(["--seed", str(SEED)]) == 0
    again = [parse(line) for line in capsys.readouterr().out.splitlines()]

    trained_to_2 = [m for m in first if isinstance(m, Metric)][-1]
    assert [m.step for m in again if isinstance(m, CheckpointRestored)] == [2]
    assert not any(isinstance(m, CheckpointSaved) for m in again)
    reports = [m for m in again if isinstance(m, Metric)]
    assert [(m.step, m.values) for m in reports] == [
        (2, {"accuracy": trained_to_2.values["accuracy"]})
    ]
