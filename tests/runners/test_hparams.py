"""A search trial's configuration as the learner reads it: none outside a search, the point and
the budget inside one, and a clear error naming the variable for anything malformed."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.config import BUDGET, BUDGET_UNIT, HPARAMS, HPARAMS_FILE, TRIAL, ConfigError
from runners.hparams import TrialConfig, load

POINT = '{"lr": 0.01, "layers": [{"width": 64, "activation": "relu"}]}'
TRIAL_ENV = {HPARAMS: POINT, BUDGET: "9", BUDGET_UNIT: "epochs", TRIAL: "4"}
EXPECTED = TrialConfig(
    hparams={"lr": 0.01, "layers": [{"width": 64, "activation": "relu"}]},
    budget=9,
    unit="epochs",
    number=4,
)


def test_a_job_that_is_not_a_trial_has_no_trial_config() -> None:
    assert load({}) is None
    # Empty counts as unset, as for every variable of the runtime.
    assert load({HPARAMS: " ", HPARAMS_FILE: "", BUDGET: "9"}) is None


def test_a_trials_variables_are_read_into_its_config() -> None:
    assert load(TRIAL_ENV) == EXPECTED
    assert load({**TRIAL_ENV, TRIAL: "", BUDGET_UNIT: "steps"}) == TrialConfig(
        hparams=EXPECTED.hparams, budget=9, unit="steps", number=None
    )


def test_the_file_is_read_only_without_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "hparams.json"
    path.write_text('{"lr": 0.5}')
    from_file = {**TRIAL_ENV, HPARAMS: "", HPARAMS_FILE: str(path)}
    assert load(from_file) == TrialConfig({"lr": 0.5}, 9, "epochs", 4)
    assert load({**from_file, HPARAMS: POINT}) == EXPECTED


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {HPARAMS: "{lr: 0.1}"},
            "TRAINYARD_HPARAMS must be a JSON object: Expecting property name enclosed in double "
            "quotes: line 1 column 2 (char 1)",
        ),
        ({HPARAMS: "[0.1]"}, "TRAINYARD_HPARAMS must be a JSON object, got list"),
        ({HPARAMS: "0.1"}, "TRAINYARD_HPARAMS must be a JSON object, got float"),
        (
            {HPARAMS: '{"lr": NaN}'},
            "TRAINYARD_HPARAMS must be a JSON object: NaN is not standard JSON",
        ),
        ({BUDGET: ""}, "TRAINYARD_BUDGET must be set when TRAINYARD_HPARAMS is"),
        ({BUDGET: "0"}, "TRAINYARD_BUDGET must be a whole number of at least 1, got '0'"),
        ({BUDGET: "-3"}, "TRAINYARD_BUDGET must be a whole number of at least 1, got '-3'"),
        ({BUDGET: "2.5"}, "TRAINYARD_BUDGET must be a whole number of at least 1, got '2.5'"),
        (
            {BUDGET_UNIT: ""},
            "TRAINYARD_BUDGET_UNIT must be set when TRAINYARD_HPARAMS is (steps, epochs)",
        ),
        ({BUDGET_UNIT: "hours"}, "TRAINYARD_BUDGET_UNIT must be one of steps, epochs, got 'hours'"),
        ({TRIAL: "first"}, "TRAINYARD_TRIAL must be a whole number, got 'first'"),
    ],
)
def test_a_malformed_trial_is_a_clear_error(changes: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load({**TRIAL_ENV, **changes})
    assert str(refused.value) == message


def test_a_file_that_cannot_be_read_or_parsed_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(ConfigError) as unreadable:
        load({**TRIAL_ENV, HPARAMS: "", HPARAMS_FILE: str(missing)})
    assert str(unreadable.value).startswith(f"{HPARAMS_FILE} ({missing}) cannot be read: ")
    broken = tmp_path / "broken.json"
    broken.write_text('{"lr": ')
    with pytest.raises(ConfigError) as unparsable:
        load({**TRIAL_ENV, HPARAMS: "", HPARAMS_FILE: str(broken)})
    assert str(unparsable.value).startswith(f"{HPARAMS_FILE} ({broken}) must be a JSON object: ")
