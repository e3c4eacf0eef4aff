"""Signals through the launcher: forwarded to the command, or not, and the launcher's own death."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from learner_process import LAUNCH, PYTHON, StartLearner

from runners.config import RESULTS_DIR, RESULTS_URI
from runners.protocol import Message, Metric, PhaseStarted

# A command that reports its pid as a metric once its handlers are in place, reports each
# SIGUSR1 it receives as another metric, and, if asked to, exits 143 on SIGTERM.
COMMAND = """
import os, signal, sys, time
from runners import metrics

requests = 0
def on_usr1(signum, frame):
    global requests
    requests += 1
if "handle-usr1" in sys.argv:
    signal.signal(signal.SIGUSR1, on_usr1)
if "handle-term" in sys.argv:
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
metrics.log(step=0, pid=os.getpid())
reported = 0
while True:
    if requests > reported:
        reported = requests
        metrics.log(step=reported, checkpoint_requests=reported)
    time.sleep(0.01)
"""


def command(*options: str) -> tuple[str, ...]:
    return (*LAUNCH, PYTHON, "-c", textwrap.dedent(COMMAND), *options)


def is_metric(name: str) -> Callable[[Message], bool]:
    def matches(message: Message) -> bool:
        return isinstance(message, Metric) and name in message.values

    return matches


def test_sigterm_is_forwarded_and_no_further_phase_starts(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    learner = start_learner(
        command("handle-term"),
        {RESULTS_DIR: tmp_path / "results", RESULTS_URI: (tmp_path / "store").as_uri()},
    )
    learner.wait_for(is_metric("pid"))

    learner.process.send_signal(signal.SIGTERM)

    assert learner.finish() == 143
    processing = learner.phase_ends()["PROCESSING"]
    assert (processing.outcome, processing.exit_code, processing.signal) == (
        "interrupted",
        143,
        None,
    )
    assert not any(isinstance(m, PhaseStarted) and m.phase == "STORING" for m in learner.messages)
    assert not (tmp_path / "store").exists()


def test_a_command_without_a_sigterm_handler_dies_of_the_forwarded_sigterm(
    start_learner: StartLearner,
) -> None:
    learner = start_learner(command())
    learner.wait_for(is_metric("pid"))

    learner.process.send_signal(signal.SIGTERM)

    assert learner.finish() == 128 + signal.SIGTERM
    processing = learner.phase_ends()["PROCESSING"]
    assert (processing.outcome, processing.exit_code, processing.signal) == (
        "interrupted",
        None,
        "SIGTERM",
    )


def test_sigusr1_is_forwarded_to_a_command_that_handles_it(start_learner: StartLearner) -> None:
    learner = start_learner(command("handle-usr1"))
    learner.wait_for(is_metric("pid"))

    learner.process.send_signal(signal.SIGUSR1)
    request = learner.wait_for(is_metric("checkpoint_requests"))

    assert isinstance(request, Metric)
    assert request.values == {"checkpoint_requests": 1.0}
    assert learner.process.poll() is None  # still training


def test_sigusr1_is_not_forwarded_to_a_command_it_would_kill(start_learner: StartLearner) -> None:
    learner = start_learner(command())
    learner.wait_for(is_metric("pid"))

    learner.process.send_signal(signal.SIGUSR1)
    # The launcher handles signals in the order they arrive: had it forwarded SIGUSR1, the
    # command would die of it before the SIGTERM sent next could reach it.
    learner.process.send_signal(signal.SIGTERM)

    assert learner.finish() == 128 + signal.SIGTERM
    assert learner.phase_ends()["PROCESSING"].signal == "SIGTERM"
    assert "SIGUSR1 (checkpoint request) not forwarded" in learner.stderr()


def test_the_command_dies_with_the_launcher(start_learner: StartLearner) -> None:
    learner = start_learner(command("handle-term"))
    started = learner.wait_for(is_metric("pid"))
    assert isinstance(started, Metric)
    child = int(started.values["pid"])

    # Only the launcher: the command must not live on, unsupervised, next to a replacement.
    os.kill(learner.process.pid, signal.SIGKILL)
    learner.process.wait()

    deadline = time.monotonic() + 30  # a bound on a hang, not an expected duration
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
