"""A warm learner (`python -m runners.warm`), driven as the agent drives it: a socket pair as its
standard input, `warm` read, an assignment sent. What the command sees and how the learner ends
are compared with the cold launcher (`python -m runners.launch`) running the same command."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from learner_process import LAUNCH, PATIENCE_S, PYTHON, Learner, learner_env

from runners.config import CPUS, EXIT_FILE, WARM_IMPORTS
from runners.protocol import Message, Metric, PhaseEnded

WARM = (PYTHON, "-m", "runners.warm")
# The agent sets the locale for every learner (node_agent.runtime.learner_env), and so for a warm
# one: without it, Python would set LC_CTYPE in its own environment as it starts.
LOCALE = {"LANG": "C.UTF-8"}
PROBE_PREFIX = "PROBE "
# What a command sees of how it was started, as one line.
PROBE = """
import json, os, signal, sys
print("PROBE " + json.dumps({
    "argv": sys.argv,
    "orig_argv": sys.orig_argv,
    "builtins": type(__builtins__).__name__,
    "path0": sys.path[0],
    "name": __name__,
    "main_file": getattr(sys.modules["__main__"], "__file__", None),
    "environ": dict(os.environ),
    "cwd": os.getcwd(),
    "handlers": {
        s.name: repr(signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    },
    "stdin": os.readlink("/proc/self/fd/0"),
    "cmdline": open("/proc/self/cmdline").read().split("\\0")[:-1],
    "ppid": os.getppid(),
    "preloaded": "preloaded_probe" in sys.modules,
}), flush=True)
"""


SEEN_AS_PYTHON_GIVES_IT = (
    "argv",
    "orig_argv",
    "builtins",
    "path0",
    "name",
    "main_file",
    "environ",
    "cwd",
    "handlers",
)


class Warm:
    """A warm learner and the agent's end of its socket."""

    def __init__(self, env: Mapping[str, str], stderr: Path) -> None:
        self.agent, theirs = socket.socketpair()
        self.agent.settimeout(PATIENCE_S)
        with theirs:
            self.learner = Learner(WARM, env, stderr, stdin=theirs.fileno(), cwd="/")

    def await_warm(self) -> None:
        said = b""
        while len(said) < len(b"warm\n") and (chunk := self.agent.recv(16)):
            said += chunk
        assert said == b"warm\n"

    def send(self, data: bytes) -> Learner:
        """Send `data` as the assignment, and end it."""
        self.await_warm()
        self.agent.sendall(data)
        self.agent.shutdown(socket.SHUT_WR)
        return self.learner

    def assign(self, command: Sequence[str], env: Mapping[str, str], cwd: Path | str) -> Learner:
        assignment = {"env": dict(env), "command": list(command), "cwd": str(cwd)}
        return self.send(json.dumps(assignment).encode())


StartWarm = Callable[..., Warm]
StartCold = Callable[..., Learner]


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Learner]]:
    learners: list[Learner] = []
    yield learners
    for learner in learners:
        learner.kill_all()


@pytest.fixture
def start_warm(tmp_path: Path, started: list[Learner]) -> StartWarm:
    """`start_warm({NAME: value})`: a warm learner whose environment is this process's (without
    TRAINYARD_*), the locale and `variables`."""

    def start(variables: Mapping[str, str | Path] | None = None) -> Warm:
        env = learner_env({**LOCALE, **(variables or {})})
        warm = Warm(env, tmp_path / f"warm-stderr-{len(started)}.txt")
        started.append(warm.learner)
        return warm

    return start


@pytest.fixture
def start_cold(tmp_path: Path, started: list[Learner]) -> StartCold:
    """`start_cold(command, env, cwd)`: `python -m runners.launch -- command`, as the agent starts
    it (standard input /dev/null)."""

    def start(command: Sequence[str], env: Mapping[str, str], cwd: Path) -> Learner:
        stderr = tmp_path / f"cold-stderr-{len(started)}.txt"
        learner = Learner((*LAUNCH, *command), env, stderr, stdin=subprocess.DEVNULL, cwd=cwd)
        started.append(learner)
        return learner

    return start


def job_env(variables: Mapping[str, str | Path] | None = None) -> dict[str, str]:
    return learner_env({**LOCALE, "A_JOB_VARIABLE": "its value", **(variables or {})})


def ends(learner: Learner) -> list[tuple[object, ...]]:
    return [
        (m.phase, m.outcome, m.error, m.exit_code, m.signal)
        for m in learner.messages
        if isinstance(m, PhaseEnded)
    ]


def probe(learner: Learner) -> dict[str, Any]:
    [line] = [line for line in learner.lines if line.startswith(PROBE_PREFIX)]
    found: dict[str, Any] = json.loads(line.removeprefix(PROBE_PREFIX))
    return found


def forked_from(warm: Warm, seen: Mapping[str, Any]) -> bool:
    """Whether the probe ran in a fork of the warm process: its child, still its program."""
    return bool(seen["ppid"] == warm.learner.process.pid and seen["cmdline"] == list(WARM))


@pytest.mark.parametrize(
    "command",
    [
        pytest.param((PYTHON, "-c", "print('hello')"), id="succeeded"),
        pytest.param((PYTHON, "-c", "raise SystemExit(3)"), id="exit-code-3"),
        pytest.param((PYTHON, "-c", "import sys; sys.exit('a message')"), id="exit-message"),
        pytest.param((PYTHON, "-c", "1 / 0"), id="uncaught-exception"),
        pytest.param(
            (PYTHON, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), id="sigkill"
        ),
        pytest.param((PYTHON, "-m", "no_such_module_anywhere"), id="missing-module"),
        pytest.param(("/bin/sh", "-c", "exit 4"), id="other-interpreter"),
        pytest.param(("/no/such/program",), id="not-found"),
    ],
)
def test_the_phases_status_and_exit_file_are_the_cold_launchers(
    command: Sequence[str], start_warm: StartWarm, start_cold: StartCold, tmp_path: Path
) -> None:
    cold_exit, warm_exit = tmp_path / "cold-exit", tmp_path / "warm-exit"
    cold = start_cold(command, job_env({EXIT_FILE: cold_exit}), tmp_path)
    warm = start_warm().assign(command, job_env({EXIT_FILE: warm_exit}), tmp_path)

    status = warm.finish()

    assert status == cold.finish()
    assert ends(warm) == ends(cold)
    assert warm_exit.read_text() == f"{status}\n"
    user_lines = [line for line in warm.lines if not line.startswith("@@")]
    assert user_lines == [line for line in cold.lines if not line.startswith("@@")]
    assert warm.stderr() == cold.stderr()


def probe_programs(tmp_path: Path) -> dict[str, tuple[str, ...]]:
    """The probe as `-c`, as `-m` (a package under the working directory) and as a script (by a
    path relative to it, through a link, as Python resolves it for sys.path[0])."""
    package = tmp_path / "probes"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "show.py").write_text(PROBE)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "show.py").write_text(PROBE)
    (tmp_path / "linked.py").symlink_to(scripts / "show.py")
    return {
        "-c": (PYTHON, "-c", PROBE, "an argument", "--option"),
        "-m": (PYTHON, "-m", "probes.show", "an argument", "--option"),
        "script": (PYTHON, "linked.py", "an argument", "--option"),
    }


@pytest.mark.parametrize("kind", ["-c", "-m", "script"])
def test_a_python_command_runs_in_a_fork_and_sees_what_python_would_give_it(
    kind: str, start_warm: StartWarm, start_cold: StartCold, tmp_path: Path
) -> None:
    command = probe_programs(tmp_path)[kind]
    cold = start_cold(command, job_env(), tmp_path)
    warm = start_warm({WARM_IMPORTS: "json"})
    learner = warm.assign(command, job_env(), tmp_path)

    assert learner.finish() == cold.finish() == 0
    seen, expected = probe(learner), probe(cold)
    assert forked_from(warm, seen)
    for field in SEEN_AS_PYTHON_GIVES_IT:
        assert seen[field] == expected[field], field
    assert WARM_IMPORTS not in seen["environ"]
    assert seen["stdin"] == "/dev/null"
    assert learner.stderr() == ""


def test_a_preloaded_module_is_imported_already(start_warm: StartWarm, tmp_path: Path) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "preloaded_probe.py").write_text("")
    path = {"PYTHONPATH": modules}
    warm = start_warm({**path, WARM_IMPORTS: "preloaded_probe, no_such_module_anywhere"})

    learner = warm.assign((PYTHON, "-c", PROBE), job_env(path), tmp_path)

    assert learner.finish() == 0
    seen = probe(learner)
    assert seen["preloaded"]
    assert forked_from(warm, seen)
    [reported] = learner.stderr().splitlines()
    assert "no_such_module_anywhere" in reported


def test_a_forked_command_computes_on_its_cpus_as_a_new_interpreter_would(
    start_warm: StartWarm, start_cold: StartCold, tmp_path: Path
) -> None:
    """torch, imported warm before the job's CPUs were known, is given them in the fork: half a
    CPU is one thread, where torch's default is a thread for each of the machine's cores."""
    threads = "import os, torch; print('PROBE', torch.get_num_threads(), os.getppid())"
    variables = job_env({CPUS: "0.5"})
    variables.pop("OMP_NUM_THREADS", None)
    cold = start_cold((PYTHON, "-c", threads), variables, tmp_path)
    warm = start_warm({WARM_IMPORTS: "torch"})
    learner = warm.assign((PYTHON, "-c", threads), variables, tmp_path)

    assert learner.finish() == cold.finish() == 0
    [seen] = [line.split()[1:] for line in learner.lines if line.startswith(PROBE_PREFIX)]
    [expected] = [line.split()[1:] for line in cold.lines if line.startswith(PROBE_PREFIX)]
    assert seen[0] == expected[0] == "1"
    assert int(seen[1]) == warm.learner.process.pid  # forked, not spawned
    assert learner.stderr() == ""


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(("/bin/sh", "-c", "exec " + PYTHON + ' -c "$0"', PROBE), id="other-program"),
        pytest.param((PYTHON, "-u", "-c", PROBE), id="interpreter-option"),
    ],
)
def test_any_other_command_is_spawned(
    command: Sequence[str], start_warm: StartWarm, tmp_path: Path
) -> None:
    warm = start_warm({WARM_IMPORTS: "json"})

    learner = warm.assign(command, job_env(), tmp_path)

    assert learner.finish() == 0
    seen = probe(learner)
    assert seen["ppid"] == warm.learner.process.pid
    assert seen["cmdline"] != list(WARM)
    assert learner.stderr() == ""


def test_a_job_environment_that_changes_the_interpreters_start_is_spawned(
    start_warm: StartWarm, tmp_path: Path
) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    warm = start_warm()

    learner = warm.assign((PYTHON, "-c", PROBE), job_env({"PYTHONPATH": modules}), tmp_path)

    assert learner.finish() == 0
    seen = probe(learner)
    assert not forked_from(warm, seen)
    assert str(modules) in seen["environ"]["PYTHONPATH"]
    [reported] = learner.stderr().splitlines()
    assert "PYTHONPATH" in reported


def test_a_running_python_thread_means_a_spawn(start_warm: StartWarm, tmp_path: Path) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "threaded_probe.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    )
    path = {"PYTHONPATH": modules}
    warm = start_warm({**path, WARM_IMPORTS: "threaded_probe"})

    learner = warm.assign((PYTHON, "-c", PROBE), job_env(path), tmp_path)

    assert learner.finish() == 0
    assert not forked_from(warm, probe(learner))
    [reported] = learner.stderr().splitlines()
    assert "thread" in reported


# Reports its pid once its handlers are in place, each SIGUSR1 as a metric, and, if asked to,
# exits 143 on SIGTERM.
SIGNALLED = textwrap.dedent("""
    import os, signal, sys, time
    from runners import metrics

    requests = 0
    def on_usr1(signum, frame):
        global requests
        requests += 1
    if "handle" in sys.argv:
        signal.signal(signal.SIGUSR1, on_usr1)
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    metrics.log(step=0, pid=os.getpid(), ppid=os.getppid())
    reported = 0
    while True:
        if requests > reported:
            reported = requests
            metrics.log(step=reported, checkpoint_requests=reported)
        time.sleep(0.01)
""")


def is_metric(name: str) -> Callable[[Message], bool]:
    def matches(message: Message) -> bool:
        return isinstance(message, Metric) and name in message.values

    return matches


def test_signals_reach_a_forked_command_that_handles_them(
    start_warm: StartWarm, tmp_path: Path
) -> None:
    warm = start_warm()
    learner = warm.assign((PYTHON, "-c", SIGNALLED, "handle"), job_env(), tmp_path)
    started = learner.wait_for(is_metric("pid"))
    assert isinstance(started, Metric)
    assert started.values["ppid"] == learner.process.pid

    learner.process.send_signal(signal.SIGUSR1)
    learner.wait_for(is_metric("checkpoint_requests"))
    learner.process.send_signal(signal.SIGTERM)

    assert learner.finish() == 143
    processing = learner.phase_ends()["PROCESSING"]
    assert (processing.outcome, processing.exit_code, processing.signal) == (
        "interrupted",
        143,
        None,
    )


def test_a_forked_command_without_handlers_dies_of_sigterm_and_is_spared_sigusr1(
    start_warm: StartWarm, tmp_path: Path
) -> None:
    warm = start_warm()
    learner = warm.assign((PYTHON, "-c", SIGNALLED), job_env(), tmp_path)
    started = learner.wait_for(is_metric("pid"))
    assert isinstance(started, Metric)
    command_pid = int(started.values["pid"])

    learner.process.send_signal(signal.SIGUSR1)
    # Not forwarded, so the command lives on: a signal sent to it directly finds it.
    os.kill(command_pid, 0)
    learner.process.send_signal(signal.SIGTERM)

    assert learner.finish() == 128 + signal.SIGTERM
    processing = learner.phase_ends()["PROCESSING"]
    assert (processing.outcome, processing.signal) == ("interrupted", "SIGTERM")
    assert "SIGUSR1 (checkpoint request) not forwarded" in learner.stderr()


def test_a_discarded_warm_learner_exits_0_running_nothing(start_warm: StartWarm) -> None:
    learner = start_warm().send(b"")

    assert learner.finish() == 0
    assert learner.lines == []
    assert learner.stderr() == ""


@pytest.mark.parametrize(
    "assignment",
    [
        pytest.param(b'{"env": {}, "command": ["true"]', id="cut-short"),
        pytest.param(b"\xff\xfe", id="not-utf-8"),
        pytest.param(b'["true"]', id="not-an-object"),
        pytest.param(b'{"env": {}, "command": ["true"]}', id="without-cwd"),
        pytest.param(b'{"env": {}, "command": [], "cwd": "/"}', id="no-command"),
        pytest.param(b'{"env": {"A": 1}, "command": ["true"], "cwd": "/"}', id="env-number"),
        pytest.param(b'{"env": {}, "command": ["true"], "cwd": "/", "more": 1}', id="unknown"),
        pytest.param(b" " * (4 * 1024 * 1024) + b"{}", id="over-4-MiB"),
    ],
)
def test_what_is_not_an_assignment_ends_the_learner_with_status_2(
    assignment: bytes, start_warm: StartWarm
) -> None:
    learner = start_warm().send(assignment)

    assert learner.finish() == 2
    assert learner.lines == []
    [reported] = learner.stderr().splitlines()
    assert reported.startswith("trainyard: the assignment")
