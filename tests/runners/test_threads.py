"""A learner's compute threads (`runners.threads`): its CPUs, rounded up, unless the job chose
them; given by the launcher to the command it starts. A warm learner's fork is in test_warm."""

from __future__ import annotations

import subprocess

import pytest
from learner_process import LAUNCH, PYTHON, learner_env

from runners.config import CPUS

# What the command computes on, and what its environment says.
SEEN = "import os, torch; print('SEEN', torch.get_num_threads(), os.environ.get('OMP_NUM_THREADS'))"


def seen(command: list[str], variables: dict[str, str]) -> list[str]:
    environ = learner_env(variables)
    if "OMP_NUM_THREADS" not in variables:
        environ.pop("OMP_NUM_THREADS", None)
    done = subprocess.run(command, env=environ, capture_output=True, text=True, check=True)
    [line] = [line for line in done.stdout.splitlines() if line.startswith("SEEN ")]
    return line.split()[1:]


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({CPUS: "0.5"}, ["1", "1"]),
        ({CPUS: "1.5"}, ["2", "2"]),
        # The job's own choice wins over its CPUs.
        ({CPUS: "0.5", "OMP_NUM_THREADS": "2"}, ["2", "2"]),
    ],
)
def test_the_launcher_gives_the_command_its_cpus_as_threads(
    variables: dict[str, str], expected: list[str]
) -> None:
    assert seen([*LAUNCH, PYTHON, "-c", SEEN], variables) == expected


def test_torch_imported_ahead_is_given_the_learner_s_cpus() -> None:
    """As in a warm sandbox that imported torch before its job's CPUs were known."""
    code = "import torch\nfrom runners.threads import fit_threads\nfit_threads()\n" + SEEN

    assert seen([PYTHON, "-c", code], {CPUS: "1.5"}) == ["2", "2"]


def test_without_cpus_the_command_has_torch_s_own_default() -> None:
    """A learner started by hand, with no CPUs from an agent."""
    assert seen([*LAUNCH, PYTHON, "-c", SEEN], {}) == seen([PYTHON, "-c", SEEN], {})
