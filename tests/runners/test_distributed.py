"""Learners in one process group (`runners.distributed`), as real processes on 127.0.0.1 with
gloo: the digits example trained by two learners ends where one learner ends over the same
global batches; a group whose rank 1 is killed resumes from rank 0's checkpoint to the weights of
a group never stopped; a wrong contract or a missing peer fails saying what is wrong."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from learner_process import PYTHON, Learner, StartLearner, learner_env

from harness.served import free_port, free_ports
from runners import config
from runners.config import CHECKPOINT_DIR, ConfigError
from runners.distributed import Contract, load_contract
from runners.protocol import CheckpointRestored, CheckpointSaved, Message, Metric

STEPS = 40
EVERY = 10
TIMEOUT_S = 10
"""The rendezvous and collective timeout the learners get: a bound on a broken test's wait."""
DDP = (
    *(PYTHON, "-m", "runners.examples.digits_ddp", "--seed", "3", "--steps", str(STEPS)),
    *("--checkpoint-every", str(EVERY), "--log-every", "5"),
)
TORCH_NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")


def contract_env(rank: int, world: int, port: int, **more: str | Path) -> dict[str, str | Path]:
    """Rank 0 gets torch's names, the others only their TRAINYARD_* twins: both must work."""
    if rank == 0:
        names = {"MASTER_ADDR": "MASTER_ADDR", "MASTER_PORT": "MASTER_PORT", "RANK": "RANK"}
        names["WORLD_SIZE"] = "WORLD_SIZE"
    else:
        names = {"MASTER_ADDR": config.MASTER_ADDR, "MASTER_PORT": config.MASTER_PORT}
        names |= {"RANK": config.RANK, "WORLD_SIZE": config.WORLD_SIZE}
    return {
        names["MASTER_ADDR"]: "127.0.0.1",
        names["MASTER_PORT"]: str(port),
        names["RANK"]: str(rank),
        names["WORLD_SIZE"]: str(world),
        config.RENDEZVOUS_TIMEOUT_S: str(TIMEOUT_S),
        **more,
    }


def start_group(
    start_learner: StartLearner, world: int, *args: str | Path, **more: str | Path
) -> list[Learner]:
    port = free_port()
    return [
        start_learner((*DDP, *map(str, args)), contract_env(rank, world, port, **more))
        for rank in range(world)
    ]


def finished(*learners: Learner) -> None:
    for learner in learners:
        assert learner.finish() == 0, learner.output()


def weights(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def result(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def without_ours(variables: Mapping[str, str | Path]) -> dict[str, str]:
    """`learner_env`, without torch's names from this process's environment either."""
    env = learner_env(variables)
    return {k: v for k, v in env.items() if k not in TORCH_NAMES or k in variables}


@pytest.fixture(autouse=True)
def no_contract_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The learners inherit this process's environment: none of torch's names from it."""
    for name in TORCH_NAMES:
        monkeypatch.delenv(name, raising=False)


@dataclass(frozen=True)
class Uninterrupted:
    """One learner alone and a group of two, over the same global batches, never stopped."""

    directory: Path
    alone: list[Message]
    pair: list[list[Message]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Uninterrupted]:
    directory = tmp_path_factory.mktemp("uninterrupted")
    port = free_port()
    # Alone, with no variable of the contract at all: a world of one, the script unchanged.
    commands = [
        ((*DDP, "--weights", directory / "one.pt", "--result", directory / "one.json"), {}),
        *(
            (
                (*DDP, "--weights", directory / "two.pt", "--result", directory / "two.json"),
                contract_env(rank, 2, port),
            )
            for rank in range(2)
        ),
    ]
    learners = [
        Learner(tuple(map(str, command)), without_ours(env), directory / f"stderr-{n}.txt")
        for n, (command, env) in enumerate(commands)
    ]
    try:
        finished(*learners)
        yield Uninterrupted(
            directory, learners[0].messages, [each.messages for each in learners[1:]]
        )
    finally:
        for learner in learners:
            learner.kill_all()


def test_two_learners_end_with_the_weights_of_one_over_the_same_global_batches(
    uninterrupted: Uninterrupted,
) -> None:
    one = weights(uninterrupted.directory / "one.pt")
    two = weights(uninterrupted.directory / "two.pt")
    assert one.keys() == two.keys()
    # Not bit-equal: each rank's mean over its half, averaged, rounds unlike one mean over all.
    assert max(float((one[k] - two[k]).abs().max()) for k in one) <= 1e-5
    assert result(uninterrupted.directory / "one.json")["world_size"] == 1
    assert result(uninterrupted.directory / "two.json")["world_size"] == 2
    assert result(uninterrupted.directory / "two.json")["ranks_agree"] is True
    # Rank 0 alone reports; the ranks' mean loss is one learner's loss, up to rounding.
    losses = [
        [m.values["loss"] for m in messages if isinstance(m, Metric)]
        for messages in (uninterrupted.alone, *uninterrupted.pair)
    ]
    assert len(losses[0]) == STEPS // 5 and losses[2] == []
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)


def test_a_group_whose_rank_1_is_killed_halfway_resumes_to_the_weights_of_one_never_stopped(
    start_learner: StartLearner, tmp_path: Path, uninterrupted: Uninterrupted
) -> None:
    checkpoints = {CHECKPOINT_DIR: tmp_path / "checkpoints"}
    # Paced, so that the run is still going when the test has read that a step is done.
    crashed = start_group(start_learner, 2, "--step-seconds", "0.1", **checkpoints)
    crashed[0].wait_for(lambda m: isinstance(m, CheckpointSaved) and m.step == STEPS // 2)
    crashed[1].kill_all()
    killed_at = time.monotonic()
    # Rank 0 is not killed by the test: its next collective finds the peer's connection reset
    # and fails at once (gloo), well within the collective timeout it would otherwise wait out.
    status = crashed[0].process.wait(timeout=TIMEOUT_S + 5)
    assert status > 0, crashed[0].output()
    assert time.monotonic() - killed_at < TIMEOUT_S
    crashed[0].finish()
    saved = [m.step for m in crashed[0].messages if isinstance(m, CheckpointSaved)]
    assert STEPS not in saved

    resumed = start_group(
        start_learner,
        2,
        "--weights",
        tmp_path / "resumed.pt",
        "--result",
        tmp_path / "r.json",
        **checkpoints,
    )
    finished(*resumed)
    restored = [m.step for m in resumed[0].messages if isinstance(m, CheckpointRestored)]
    assert restored == [max(saved)] and STEPS // 2 <= max(saved) < STEPS
    assert resumed[1].messages == []  # rank 1 restored too, but only rank 0 reports
    # Exactly equal: the same world size does the same arithmetic in the same order (one thread,
    # deterministic kernels, a sum of two in gloo), and the checkpoint holds the whole state;
    # saving checkpoints (the uninterrupted group saved none) changes nothing of it.
    straight = weights(uninterrupted.directory / "two.pt")
    ours = weights(tmp_path / "resumed.pt")
    assert all(torch.equal(straight[k], ours[k]) for k in straight)
    assert result(tmp_path / "r.json")["ranks_agree"] is True


def test_a_sigterm_to_one_rank_saves_once_from_rank_0_and_ends_every_rank(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    checkpoints = {CHECKPOINT_DIR: tmp_path / "checkpoints"}
    group = start_group(start_learner, 2, "--step-seconds", "0.05", **checkpoints)
    group[0].wait_for(lambda m: isinstance(m, Metric) and m.step == 5)
    os.kill(group[1].process.pid, signal.SIGTERM)  # rank 1 alone: the request reaches both
    assert [learner.finish() for learner in group] == [143, 143]
    saved = [m.step for m in group[0].messages if isinstance(m, CheckpointSaved)]
    # Every-10 checkpoints may come first; then the one the SIGTERM asked for, the last, both
    # ranks having stopped at that step.
    assert saved and saved[-1] < STEPS
    assert all(step % EVERY == 0 for step in saved[:-1])
    assert group[1].messages == []


def test_an_empty_environment_is_a_world_of_one() -> None:
    assert load_contract({}) == Contract(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        master_addr=None,
        master_port=None,
        timeout_s=config.DEFAULT_RENDEZVOUS_TIMEOUT_S,
    )


def test_the_twins_stand_in_for_torchs_names_and_torchs_win_when_both_agree() -> None:
    twins = {
        config.MASTER_ADDR: "10.0.0.1",
        config.MASTER_PORT: "29500",
        config.RANK: "3",
        config.WORLD_SIZE: "4",
        config.LOCAL_RANK: "1",
        config.LOCAL_WORLD_SIZE: "2",
        config.NODE_RANK: "1",
        config.RENDEZVOUS_TIMEOUT_S: "2.5",
    }
    contract = load_contract(twins)
    assert contract == Contract(3, 4, 1, 2, 1, "10.0.0.1", 29500, 2.5)
    assert load_contract({**twins, "RANK": "3", "WORLD_SIZE": "4"}) == contract


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 must be less than WORLD_SIZE=2"),
        ({config.RANK: "5"}, "TRAINYARD_RANK=5 must be less than WORLD_SIZE=1"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE must be a whole number of at least 1, got 'two'"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE must be a whole number of at least 1, got '0'"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK must be a whole number of at least 0"),
        ({"RANK": "1.0", "WORLD_SIZE": "2"}, "RANK must be a whole number of at least 0"),
        ({"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK (or TRAINYARD_RANK)"),
        ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "MASTER_PORT (or TRAINYARD_MAS"),
        ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR (or TRAINYARD_MAS"),
        ({"MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT must be a TCP port"),
        ({"RANK": "1", config.RANK: "0"}, "RANK='1' and TRAINYARD_RANK='0' disagree"),
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"}, "LOCAL_RANK=1 must be less than LOCAL_W"),
        ({"LOCAL_WORLD_SIZE": "2"}, "LOCAL_WORLD_SIZE=2 is more than WORLD_SIZE=1"),
        ({"NODE_RANK": "x"}, "NODE_RANK must be a whole number"),
        ({config.RENDEZVOUS_TIMEOUT_S: "0"}, "TRAINYARD_RENDEZVOUS_TIMEOUT_S must be a positive"),
        ({config.RENDEZVOUS_TIMEOUT_S: "inf"}, "TRAINYARD_RENDEZVOUS_TIMEOUT_S must be a positive"),
    ],
)
def test_a_bad_contract_is_refused_naming_the_variable(
    environ: Mapping[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_contract(environ)
    assert message in str(refused.value)


def test_a_learner_given_a_bad_contract_fails_at_once_saying_which_variable(
    start_learner: StartLearner,
) -> None:
    learner = start_learner(DDP, {"RANK": "2", "WORLD_SIZE": "2"})
    assert learner.finish() == 2  # a usage error, as argparse reports one
    assert "RANK=2 must be less than WORLD_SIZE=2" in learner.stderr()


def test_a_rendezvous_with_a_missing_peer_fails_within_the_timeout_saying_so(
    start_learner: StartLearner,
) -> None:
    """Rank 0 alone waits for a peer that never comes; rank 1 alone (at another port) for a
    store that nobody keeps."""
    timeout_s = 2
    started = time.monotonic()
    # Two different ports: at one port the two would meet and train.
    alone = [
        start_learner(DDP, contract_env(rank, 2, port, **{config.RENDEZVOUS_TIMEOUT_S: "2"}))
        for rank, port in enumerate(free_ports(2))
    ]
    for rank, learner in enumerate(alone):
        assert learner.finish() == 1
        stderr = learner.stderr()
        assert f"rank {rank} of 2 did not meet its peers at 127.0.0.1:" in stderr, stderr
        assert f"within {timeout_s} s (TRAINYARD_RENDEZVOUS_TIMEOUT_S)" in stderr
    # The wait itself is the timeout; the rest is the interpreters importing torch.
    assert timeout_s <= time.monotonic() - started < timeout_s + 30
