"""A learner's environment: what the agent sets wins over whatever its spec carries, so that no
manifest (nor a job stored before reserved names were refused) says who a learner is, which GPUs
it owns, or what loads before its command."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from uuid import UUID

import pytest

from node_agent.process_runtime import process_env
from node_agent.runtime import LearnerSpec, learner_env

GPU = "GPU-0b6b7c4e-0000-4000-8000-000000000001"
FORGED = {
    "TRAINYARD_JOB_ID": str(UUID(int=666)),
    "TRAINYARD_EPOCH": "999",
    "TRAINYARD_NODE": "elsewhere",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "HOME": "/root",
    "USER": "root",
    "LANG": "xx",
    "PATH": "/evil/bin",
    "PYTHONUNBUFFERED": "0",
    "TRAINYARD_EXIT_FILE": "/etc/passwd",
    "NCCL_DEBUG": "INFO",
}


def spec(tmp_path: Path) -> LearnerSpec:
    return LearnerSpec(
        job_id=UUID(int=1),
        attempt=2,
        learner=3,
        epoch=4,
        node="n1",
        image="i",
        command=["train"],
        env=FORGED,
        workdir=tmp_path,
        gpus=[GPU],
        cpus=1,
        memory_mb=64,
    )


def test_the_agent_s_variables_win_over_the_spec_s(tmp_path: Path) -> None:
    env = learner_env(spec(tmp_path), path="/usr/bin:/bin")
    assert env["TRAINYARD_JOB_ID"] == str(UUID(int=1))
    assert (env["TRAINYARD_EPOCH"], env["TRAINYARD_NODE"]) == ("4", "n1")
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == GPU
    assert (env["HOME"], env["LANG"], env["PATH"]) == (str(tmp_path), "C.UTF-8", "/usr/bin:/bin")
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["NCCL_DEBUG"] == "INFO"  # the user's own variables stay


def test_a_learner_is_named_after_its_uid_which_has_no_passwd_entry(tmp_path: Path) -> None:
    """Found on a GPU machine: torch asks getpass.getuser() for its kernel cache's folder, and
    a uid without a passwd entry made CUDA training exit at once, unless USER names it."""
    env = learner_env(dataclasses.replace(spec(tmp_path), user=(20007, 20007)), path="/bin")
    assert env["USER"] == env["LOGNAME"] == "trainyard-20007"
    assert learner_env(spec(tmp_path), path="/bin")["USER"] == "trainyard-learner"


def test_a_process_learner_s_exit_file_is_the_agent_s(tmp_path: Path) -> None:
    assert process_env(spec(tmp_path))["TRAINYARD_EXIT_FILE"] == str(tmp_path / "exit-status")


def test_a_process_learner_finds_the_launcher_s_python_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest written for the learner image runs `python -m ...`: as a process it must get
    the launcher's interpreter (which has `runners`), not whichever python the node has first."""
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin")
    launched = dataclasses.replace(
        spec(tmp_path), command=["/opt/venv/bin/python", "-m", "runners.launch", "--", "python"]
    )
    assert process_env(launched)["PATH"] == "/opt/venv/bin:/usr/local/bin:/usr/bin"
    # A launcher named without a folder leaves the node's PATH as it is.
    assert process_env(spec(tmp_path))["PATH"] == "/usr/local/bin:/usr/bin"
