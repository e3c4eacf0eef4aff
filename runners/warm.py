"""`python -m runners.warm`: a learner started before its job is known, in a warm sandbox.

The node agent makes sandboxes ahead (`node_agent.warm`), each running this process, which
serves exactly one learner:

1. It starts with its standard input one end of a Unix stream socket pair (the agent holds the
   other), its standard output and error the future learner's, the working directory `/`, and an
   environment of the agent's choosing that holds nothing of any job. It imports the launcher
   and the modules TRAINYARD_WARM_IMPORTS names (comma-separated, e.g. `torch`; one that fails is
   reported in one line on standard error and skipped), then says `warm\\n` on the socket.
2. It reads its assignment until the agent shuts down its side of the socket: one UTF-8 JSON
   object `{"env": {NAME: VALUE}, "command": [ARG, ...], "cwd": DIRECTORY}` of at most 4 MiB.
   Nothing at all means the agent discarded the sandbox: it exits 0 and runs nothing. Anything
   else that is not an assignment: one line on standard error, exit status 2.
3. It lets go of the socket (standard input becomes /dev/null), takes `env` as its whole
   environment and `cwd` as its working directory, and from then on is
   `python -m runners.launch -- COMMAND...` (`launch.run`): the same phases, protocol lines,
   exit status and exit file. It then ends as Python does (its exit handlers run, its streams
   flushed) but without tearing its interpreter down, which only frees memory.

One thing differs: PROCESSING runs a Python command of this very interpreter (`-c CODE`,
`-m MODULE` or `SCRIPT`, then its arguments, and no interpreter option) in a fork of this process
instead of a new interpreter, so what was imported ahead is imported already. The fork runs the
command as `python` would: its `sys.argv` and `sys.path[0]`, a fresh `__main__`, default signal
handlers, Python's exit status and exit sequence (`Program.run_as_main`). Where a fork could not
be that, the command is spawned as the cold launcher does, and one line on standard error says
why: a Python thread is running, this interpreter was started with options, or the job's
environment differs from the warm one in what is read once at start (`READ_AT_START_PREFIXES`,
the user's site-packages).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import runpy
import shlex
import shutil
import signal
import site
import sys
import threading
import types
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from runners import launch
from runners.config import WARM_IMPORTS
from runners.supervise import Child, fork, spawn
from runners.threads import fit_threads

AGENT = 0
"""The agent's socket, standard input until the assignment has been read."""
WARM = b"warm\n"
MAX_ASSIGNMENT_BYTES = 4 * 1024 * 1024
EXIT_BAD_ASSIGNMENT = 2
THIS_PROGRAM = ["-m", "runners.warm"]

READ_AT_START_PREFIXES = (
    # The interpreter's own (its path, flags, hash seed, stream encodings and buffering), the
    # dynamic loader's (a library a warm import loaded stays as it was loaded) and the C
    # library's allocator's.
    "PYTHON",
    "LD_",
    "MALLOC_",
    "GLIBC_TUNABLES",
    # The locale: the standard streams' encoding is chosen as the interpreter starts.
    "LC_",
    "LANG",
    # The time zone, read as `time` is imported.
    "TZ",
    # The thread pools of the numeric libraries that torch and numpy load, sized as they load.
    "OMP_",
    "MKL_",
    "OPENBLAS_",
)
"""Variables (by prefix) read once, as the interpreter starts or a warm import loads a library:
a job's that differ from the warm environment's make its command start as a new process."""


class AssignmentError(ValueError):
    """What the agent sent is not an assignment; the message says why."""


@dataclass(frozen=True)
class Assignment:
    env: dict[str, str]
    command: list[str]
    cwd: str


def parse_assignment(data: bytes) -> Assignment:
    try:
        document = json.loads(data.decode("utf-8"))
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError both are
        raise AssignmentError(f"the assignment is not UTF-8 JSON: {error}") from error
    if not isinstance(document, dict) or document.keys() != {"env", "command", "cwd"}:
        raise AssignmentError('the assignment is not an object of "env", "command" and "cwd"')
    env, command, cwd = document["env"], document["command"], document["cwd"]
    if not (
        isinstance(env, dict)
        and all(_is_text(name) and "=" not in name and _is_text(v) for name, v in env.items())
    ):
        raise AssignmentError('the assignment\'s "env" is not an object of names to strings')
    if not (isinstance(command, list) and command and all(_is_text(arg) for arg in command)):
        raise AssignmentError('the assignment\'s "command" is not a non-empty array of strings')
    if not (_is_text(cwd) and cwd):
        raise AssignmentError('the assignment\'s "cwd" is not a directory name')
    return Assignment(env=env, command=command, cwd=cwd)


def _is_text(value: object) -> bool:
    """A string the operating system can take: environment, arguments and paths end at a NUL."""
    return isinstance(value, str) and "\0" not in value


def main() -> int:
    warm_environ = dict(os.environ)
    if not sys.flags.safe_path:
        # The entry Python put first for this process (its directory, `/`): the command's own
        # takes its place (`Program.run_as_main`).
        del sys.path[0]
    preload(os.environ.get(WARM_IMPORTS, ""))
    try:
        _send(WARM)
        data = _receive_all()
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the agent is gone or let go of the sandbox: nothing to run
    except AssignmentError as error:
        print(f"trainyard: {error}", file=sys.stderr)
        return EXIT_BAD_ASSIGNMENT
    if not data:
        return 0  # discarded
    try:
        assignment = parse_assignment(data)
    except AssignmentError as error:
        print(f"trainyard: {error}", file=sys.stderr)
        return EXIT_BAD_ASSIGNMENT
    _let_go_of_agent()
    os.environ.clear()
    os.environ.update(assignment.env)
    try:
        os.chdir(assignment.cwd)
    except OSError as error:
        print(f"trainyard: cannot change to {assignment.cwd}: {error}", file=sys.stderr)
        return EXIT_BAD_ASSIGNMENT
    status = launch.run(
        assignment.command, os.environ, start=lambda command: start(command, warm_environ)
    )
    # The learner's end, and so its job's, waits for this process's: Python's teardown of this
    # interpreter (its modules and objects, what the warm imports made) only frees memory, and
    # took tens of milliseconds of it. Its exit handlers run and its streams are flushed first,
    # as the command's fork ends (`supervise.fork`).
    _end_as_python_does()
    os._exit(status & 0xFF)


def preload(names: str) -> None:
    """Import each module of a comma-separated list, reporting (not raising) a failure: the
    command imports the module itself and sees the error there, in full."""
    for name in filter(None, (name.strip() for name in names.split(","))):
        try:
            importlib.import_module(name)
        except Exception as error:  # whatever a module's import raises
            reason = " ".join(f"{type(error).__name__}: {error}".split())
            print(f"trainyard: warm import of {name} failed, skipped: {reason}", file=sys.stderr)


def _send(data: bytes) -> None:
    while data:
        data = data[os.write(AGENT, data) :]


def _receive_all() -> bytes:
    """What the agent sends, up to its end of the stream."""
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(AGENT, 1 << 16):
        size += len(chunk)
        if size > MAX_ASSIGNMENT_BYTES:
            raise AssignmentError(f"the assignment is over {MAX_ASSIGNMENT_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _let_go_of_agent() -> None:
    """Standard input becomes /dev/null, which closes the socket: the learner, and anything it
    starts, never holds the agent's end."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, AGENT)
    os.close(devnull)


def start(command: Sequence[str], warm_environ: Mapping[str, str]) -> Child:
    """PROCESSING's start (`launch.Start`): a fork for a Python command of this interpreter that a
    fork can run as `python` would, a new process otherwise."""
    program = Program.of(command)
    # Judged on the job's environment as given: the threads' default is not the job's choice.
    reason = None if program is None else why_not_fork(warm_environ, os.environ)
    if program is not None and reason is None:
        return fork(lambda: _fitted(program))
    if reason is not None:
        print(f"trainyard: the command runs in a new interpreter: {reason}", file=sys.stderr)
    fit_threads()
    return spawn(command)


def _fitted(program: Program) -> int:
    """The forked command, its threads fitted in the fork rather than before it: torch may start
    its thread pool as it is given a size, and a fork carries no thread into the child."""
    fit_threads()
    return program.run_as_main()


def why_not_fork(warm_environ: Mapping[str, str], environ: Mapping[str, str]) -> str | None:
    """Why this process cannot fork into the command as `python` would start it, if it cannot."""
    if sys.orig_argv[1:] != THIS_PROGRAM:
        return f"the warm interpreter was started with options ({shlex.join(sys.orig_argv)})"
    differing = sorted(
        name
        for name in warm_environ.keys() | environ.keys()
        if name.startswith(READ_AT_START_PREFIXES) and warm_environ.get(name) != environ.get(name)
    )
    if differing:
        return f"the job's environment differs in what is read at start: {', '.join(differing)}"
    if _user_site(warm_environ) != _user_site(environ):
        return "the job's HOME has a user site-packages of its own"
    # A fork copies only the thread that forks: a lock another thread holds at that moment (the
    # allocator's, a stream's, logging's) stays held in the child for ever, and the child hangs
    # on it. Native threads are not counted: the pools of numeric libraries (OpenBLAS starts one
    # as numpy is imported) stop and restart themselves across a fork, and the warm process has
    # computed nothing that would have started one that does not (OpenMP's).
    if threading.active_count() != 1:
        return f"{threading.active_count() - 1} Python threads besides the main one are running"
    return None


def _user_site(environ: Mapping[str, str]) -> str | None:
    """The user's site-packages that Python, started with `environ`, puts on sys.path (as `site`
    finds it on Linux: under PYTHONUSERBASE, else HOME's `.local`), if any."""
    if not site.ENABLE_USER_SITE:
        return None  # in a virtual environment, as with -s
    base = environ.get("PYTHONUSERBASE")
    if not base:
        home = environ.get("HOME")
        if not home:
            # Python would ask the password database, where a learner's uid has no entry.
            return None
        base = os.path.join(home, ".local")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    path = os.path.join(base, "lib", version, "site-packages")
    return path if os.path.isdir(path) else None


@dataclass(frozen=True)
class Program:
    """A Python command of this interpreter: `-c CODE`, `-m MODULE` or `SCRIPT`, then arguments."""

    command: tuple[str, ...]
    kind: Literal["-c", "-m", "script"]
    target: str  # the code, the module's name, the script's path
    args: tuple[str, ...]

    @classmethod
    def of(cls, command: Sequence[str]) -> Program | None:
        """The program `command` runs, or None when it is not one a fork of this process runs."""
        if len(command) < 2 or not _is_this_interpreter(command[0]):
            return None
        first, rest = command[1], tuple(command[2:])
        if first in ("-c", "-m"):
            if not rest:
                return None  # a usage error, which Python reports itself
            return cls(tuple(command), "-c" if first == "-c" else "-m", rest[0], rest[1:])
        if first.startswith("-") or not _is_source_file(first):
            return None  # an option, standard input, or what Python runs otherwise (below)
        return cls(tuple(command), "script", first, rest)

    def run_as_main(self) -> int:
        """Run the program as `python` would, in this process; its exit status, once what the
        interpreter does at its end has been done."""
        main = self._become_main()
        interrupted = False
        try:
            if self.kind == "-m":
                # Private, but what `python -m` itself calls (Modules/main.c): sys.argv[0] becomes
                # the module's file, the code runs in the real `__main__`, and a module that
                # cannot be found is reported as Python reports it.
                runpy._run_module_as_main(self.target)  # type: ignore[attr-defined]
            else:
                exec(self._compile(), main.__dict__)
            status = 0
        except SystemExit as exit:
            status = _exit_status(exit.code)
        except BaseException as error:
            # Reported as Python reports it, without this module's frames: the traceback starts
            # where the command's own code (or runpy's, for `-m`) does.
            traceback = error.__traceback__
            while traceback is not None and traceback.tb_frame.f_globals is globals():
                traceback = traceback.tb_next
            error = error.with_traceback(traceback)
            sys.excepthook(type(error), error, traceback)
            status = 1
            interrupted = isinstance(error, KeyboardInterrupt)
        _end_as_python_does()
        if interrupted:
            # Python's end for an uncaught KeyboardInterrupt: killed by SIGINT, as a shell expects.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            return 128 + signal.SIGINT
        return status

    def _become_main(self) -> types.ModuleType:
        main = types.ModuleType("__main__")
        # The module, as Python gives `__main__` (exec would put in the dict of its contents).
        main.__builtins__ = builtins  # type: ignore[attr-defined]
        if self.kind == "-c":
            main.__loader__ = importlib.machinery.BuiltinImporter
        elif self.kind == "script":
            path = os.path.abspath(self.target)
            main.__file__ = path
            main.__cached__ = None  # type: ignore[attr-defined]  # set on every module by import
            main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
        sys.modules["__main__"] = main
        sys.argv = [self.target if self.kind == "script" else self.kind, *self.args]
        sys.orig_argv = list(self.command)
        if not sys.flags.safe_path:
            sys.path.insert(0, self._first_path())
        # Directories the warm process listed may have changed since (the job's own files).
        importlib.invalidate_caches()
        return main

    def _first_path(self) -> str:
        """sys.path[0] as Python sets it: the working directory for `-m` (for `-c`, as ''), the
        script's own directory, with links resolved, for a script."""
        if self.kind == "-c":
            return ""
        if self.kind == "-m":
            return os.getcwd()
        return os.path.dirname(os.path.realpath(self.target))

    def _compile(self) -> types.CodeType:
        # dont_inherit: this module's `from __future__` imports are not the command's.
        if self.kind == "-c":
            return compile(self.target, "<string>", "exec", dont_inherit=True)
        with open(self.target, "rb") as script:
            source = script.read()
        return compile(source, os.path.abspath(self.target), "exec", dont_inherit=True)


def _is_this_interpreter(program: str) -> bool:
    """Whether `program` is the file this interpreter runs from, in the same directory: a
    virtual environment's `python` is a link to its base interpreter, and Python tells which
    environment it runs in (and so its sys.path) from the directory it was started from."""
    # Found as exec finds it: on the job's PATH (the command inherits the environment).
    found = program if os.sep in program else shutil.which(program)
    if found is None:
        return False
    path = os.path.abspath(found)
    ours = sys.executable
    return os.path.realpath(path) == os.path.realpath(ours) and os.path.realpath(
        os.path.dirname(path)
    ) == os.path.realpath(os.path.dirname(ours))


def _is_source_file(path: str) -> bool:
    """Whether Python runs `path` as a source file: not a directory or a zip archive (their
    `__main__` runs, with themselves first on sys.path), nor compiled code, nor missing (Python
    reports that itself)."""
    try:
        with open(path, "rb") as script:
            magic = script.read(len(importlib.util.MAGIC_NUMBER))
    except OSError:
        return False
    return magic != importlib.util.MAGIC_NUMBER and not zipfile.is_zipfile(path)


def _exit_status(code: object) -> int:
    """The exit status for `SystemExit(code)`, as Python gives it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _end_as_python_does() -> None:
    """What the interpreter does at its end, in its order, before the fork's `os._exit`: wait for
    the threads that are not daemons, run the exit handlers, flush the standard streams."""
    # Private, but multiprocessing's fork calls it in its child for the same reason.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # Closed or broken by the command: Python's end ignores that too.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


if __name__ == "__main__":
    sys.exit(main())
