"""The PROCESSING phase's machinery: the user's command as a child process, and signals.

The launcher stands between whoever stops or pokes a learner (Docker, the node agent, a terminal)
and the user's command. `SignalRouter` decides what each signal does at each moment:

* SIGTERM while the command runs is forwarded to it (preemption, cancel, node drain: the
  command checkpoints and exits); at any other time it stops the launcher itself, at once during
  a download or a copy, otherwise before the next phase starts.
* SIGUSR1 (a checkpoint request) is forwarded only to a command that handles it: its default
  action is to terminate, and a request for a checkpoint must never kill a job whose code does
  not checkpoint. Without a running command it is dropped.
* SIGINT is not forwarded: a terminal sends it to the whole process group, the command included,
  so forwarding it would deliver it twice. It otherwise counts as SIGTERM does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn, Protocol

from runners.phases import Interrupted

TERMINATING = frozenset({signal.SIGTERM, signal.SIGINT})
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name of its own
        return f"signal {signum}"


class Child(Protocol):
    """The running command: a new process (`spawn`, a `subprocess.Popen`) or a fork of the
    launcher's own (`fork`)."""

    @property
    def pid(self) -> int: ...

    def wait(self) -> int:
        """Wait for the command to end; its return code (negative: killed by that signal)."""
        ...

    def send_signal(self, sig: int) -> None:
        """Send `sig`, unless the command has already been waited for."""
        ...


@dataclass(frozen=True)
class ChildExit:
    """How the command ended, from `Child.wait` (negative: killed by that signal)."""

    exit_code: int | None
    signal: str | None
    # What the launcher exits with to pass the outcome on: the exit code, or 128 + the signal
    # number as a shell reports a killed command (a signal cannot be passed on as such: the
    # launcher may be PID 1 in a container, which the kernel shields from default signal actions).
    status: int

    @classmethod
    def from_returncode(cls, returncode: int) -> ChildExit:
        if returncode < 0:
            return cls(exit_code=None, signal=signal_name(-returncode), status=128 - returncode)
        return cls(exit_code=returncode, signal=None, status=returncode)

    def describe(self) -> str:
        if self.signal is not None:
            return f"command was killed by {self.signal}"
        return f"command exited with code {self.exit_code}"


def caught_signals(proc_status: str) -> frozenset[int]:
    """The signals a process has handlers for, from the text of its /proc/PID/status."""
    for line in proc_status.splitlines():
        field, _, value = line.partition(":")
        if field == "SigCgt":
            mask = int(value.strip(), 16)
            return frozenset(n for n in range(1, mask.bit_length() + 1) if mask >> (n - 1) & 1)
    return frozenset()


def handles_signal(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (Linux; False when it cannot be told)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            return signum in caught_signals(status.read())
    except OSError:
        return False


def spawn(command: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start the command with the launcher's environment and standard streams.

    On Linux the child is also tied to the launcher's life: if the launcher dies (even by
    SIGKILL), the kernel kills the child, so no orphaned trainer keeps writing checkpoints next
    to the attempt that replaces it.
    """
    preexec = _die_with_parent(os.getpid()) if sys.platform == "linux" else None
    return subprocess.Popen(list(command), preexec_fn=preexec)


class Forked:
    """A child made by `fork`, waited for and signalled as `subprocess.Popen` does one."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # Once waited for, the pid may already be another process's.
        if self.returncode is None:
            # ProcessLookupError: it has ended, not yet waited for.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


def fork(body: Callable[[], int]) -> Forked:
    """Run `body` in a fork of this process, which exits with the status `body` returns.

    The child is what `spawn` makes of a new process, as far as a fork can be: its standard
    streams and environment are the launcher's, every Python signal handler is back to its
    default (SIGINT to Python's `default_int_handler`, as a new interpreter has it), and it dies
    with the launcher. Every signal is blocked across the fork until the child has reset its
    handlers: a SIGTERM forwarded at once would otherwise run the launcher's handler in the child,
    which would swallow it. And, as `subprocess.Popen` returns once its child has exec'd, this
    returns once the child has reset them: until then its handlers read as the launcher's
    (`handles_signal`), and a SIGUSR1 forwarded on that word would kill a command that has none.
    """
    die_with_parent = _die_with_parent(os.getpid()) if sys.platform == "linux" else None
    # What the buffers hold now would otherwise be written twice, once by each process.
    sys.stdout.flush()
    sys.stderr.flush()
    ready, say_ready = os.pipe()
    with open(ready, "rb", buffering=0) as child_setup:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            pid = os.fork()
            if pid == 0:
                _forked(body, mask, die_with_parent, (ready, say_ready))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(say_ready)
        child_setup.read()  # the end of the pipe: the child closed it, or died
    return Forked(pid)


def _forked(
    body: Callable[[], int],
    mask: Iterable[int],
    die_with_parent: Callable[[], None] | None,
    pipe: tuple[int, int],
) -> NoReturn:
    status = 1
    try:
        os.close(pipe[0])
        for signum in signal.valid_signals():
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if die_with_parent is not None:
            die_with_parent()
        os.close(pipe[1])  # the command holds neither end
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        status = body()
    except BaseException:
        # `body` handles its own errors: this is the child's setup failing.
        traceback.print_exc()
    finally:
        # os._exit, as multiprocessing's fork does: a return or an exception would carry the
        # child up through the launcher's frames, to run its phases a second time, and a normal
        # exit would run what the launcher registered to run at its own end (`body` has run the
        # exit handlers that are the command's, and flushed its streams). An exit status is 8
        # bits, and os._exit must not fail here on one that does not fit.
        os._exit(status & 0xFF)


def _die_with_parent(parent: int) -> Callable[[], None]:
    # libc is loaded here, in the launcher: between fork and exec the child may only do simple,
    # async-signal-safe work, and loading a library is not.
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def set_parent_death_signal() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL)) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        # The launcher may have died before the prctl took effect; then no signal would come.
        if os.getppid() != parent:
            os._exit(1)

    return set_parent_death_signal


class SignalRouter:
    """The launcher's handler for SIGTERM, SIGINT and SIGUSR1 (see the module's description).

    Python runs signal handlers in the main thread, between two bytecodes of whatever it was
    doing, so the state below is only ever touched by one thread and needs no lock.
    """

    def __init__(self) -> None:
        self.received: int | None = None  # the latest terminating signal received
        self._child: Child | None = None
        self._interruptible = False

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(signum, self._handle)

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A block that a terminating signal interrupts at once by raising `Interrupted`."""
        if self.received is not None:
            raise Interrupted(signal_name(self.received))
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False

    @contextmanager
    def forwarding_to(self, child: Child) -> Iterator[None]:
        """A block during which signals are passed on to `child`."""
        self._child = child
        try:
            # A SIGTERM that came while the child was being started found no child to forward
            # to; it is owed to the child now.
            if self.received == signal.SIGTERM:
                child.send_signal(signal.SIGTERM)
            yield
        finally:
            self._child = None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if signum in TERMINATING:
            self.received = signum
        child = self._child
        if child is not None:
            self._forward(child, signum)
        elif self._interruptible and signum in TERMINATING:
            raise Interrupted(signal_name(signum))

    @staticmethod
    def _forward(child: Child, signum: int) -> None:
        if signum == signal.SIGTERM:
            child.send_signal(signum)
        elif signum == signal.SIGUSR1:
            if handles_signal(child.pid, signum):
                child.send_signal(signum)
            else:
                # os.write, not print: a handler may run while the main thread is inside a
                # write to sys.stderr, and a buffered stream refuses a reentrant call.
                os.write(
                    2,
                    b"trainyard: SIGUSR1 (checkpoint request) not forwarded: the command has no"
                    b" handler for it, and by default it would terminate the command\n",
                )
