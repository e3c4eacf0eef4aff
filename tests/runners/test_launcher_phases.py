"""The launcher's phases, run as a real process: data in, command, results out, and bad input."""

from __future__ import annotations

import hashlib
import http.server
import signal
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from learner_process import LAUNCH, PYTHON, Learner, StartLearner

from harness.served import free_port
from runners.config import CHECKPOINT_DIR, DATA_DIR, DATA_SHA256, DATA_URI, RESULTS_DIR, RESULTS_URI
from runners.protocol import Message, PhaseEnded, PhaseStarted

CONTENT = b"x,y\n1,2\n3,4\n"
DIGEST = hashlib.sha256(CONTENT).hexdigest()

# Writes a marker, so a test can tell whether the command ran at all.
MARKER_COMMAND = (PYTHON, "-c", "import pathlib, sys; pathlib.Path(sys.argv[1]).touch()")
WRITE_RESULT = (
    "import os, pathlib; pathlib.Path(os.environ['TRAINYARD_RESULTS_DIR'], 'result.txt').touch()"
)


def python(code: str, *args: str) -> tuple[str, ...]:
    return (*LAUNCH, PYTHON, "-c", textwrap.dedent(code), *args)


def trail(messages: list[Message]) -> list[tuple[str, ...]]:
    """The phase reports in order, as (phase, "started") or (phase, outcome)."""
    found: list[tuple[str, ...]] = []
    for message in messages:
        if isinstance(message, PhaseStarted):
            found.append((message.phase, "started"))
        elif isinstance(message, PhaseEnded):
            found.append((message.phase, message.outcome))
    return found


def failed_downloading(learner: Learner) -> str:
    """The error of a DOWNLOADING that failed and was the only phase."""
    assert trail(learner.messages) == [("DOWNLOADING", "started"), ("DOWNLOADING", "failed")]
    error = learner.phase_ends()["DOWNLOADING"].error
    assert error is not None
    return error


class _Routes(http.server.BaseHTTPRequestHandler):
    """Serves `files`; `/stall` sends half a body, then waits until the server closes."""

    files: ClassVar[dict[str, bytes]] = {}
    stalled: ClassVar = threading.Event()
    release: ClassVar = threading.Event()

    def do_GET(self) -> None:
        if self.path == "/stall":
            self.send_response(200)
            self.send_header("Content-Length", str(2 * len(CONTENT)))
            self.end_headers()
            self.wfile.write(CONTENT)
            self.wfile.flush()
            self.stalled.set()
            self.release.wait()
            return
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test output is the learner's."""


@pytest.fixture
def http_base() -> Iterator[str]:
    """A loopback HTTP server's base URL, serving `CONTENT` at /set.csv."""
    _Routes.files = {"/set.csv": CONTENT}
    _Routes.stalled.clear()
    _Routes.release.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Routes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Routes.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "source" / "set.csv"
    path.parent.mkdir()
    path.write_bytes(CONTENT)
    return path


def test_phases_run_in_order_and_the_results_are_stored(
    start_learner: StartLearner, tmp_path: Path, source: Path
) -> None:
    destination = tmp_path / "store" / "job-1"
    learner = start_learner(
        python(
            """
            import os, pathlib
            rows = pathlib.Path(os.environ["TRAINYARD_DATA_DIR"], "set.csv").read_text()
            results = pathlib.Path(os.environ["TRAINYARD_RESULTS_DIR"])
            (results / "nested").mkdir()
            (results / "nested" / "rows.txt").write_text(str(len(rows.splitlines())))
            print("plain output passes through")
            """
        ),
        {
            DATA_URI: source.as_uri(),
            DATA_SHA256: DIGEST,
            DATA_DIR: tmp_path / "data",
            RESULTS_DIR: tmp_path / "results",
            RESULTS_URI: destination.as_uri(),
        },
    )

    assert learner.finish() == 0, learner.output()
    assert trail(learner.messages) == [
        ("DOWNLOADING", "started"),
        ("DOWNLOADING", "succeeded"),
        ("PROCESSING", "started"),
        ("PROCESSING", "succeeded"),
        ("STORING", "started"),
        ("STORING", "succeeded"),
    ]
    assert learner.phase_ends()["PROCESSING"].exit_code == 0
    assert "plain output passes through\n" in learner.lines
    assert (tmp_path / "data" / "set.csv").read_bytes() == CONTENT
    assert (destination / "nested" / "rows.txt").read_text() == "3"
    # Nothing but the destination itself is left next to it (no staging copies).
    assert [p.name for p in destination.parent.iterdir()] == ["job-1"]


def test_a_directory_source_is_copied_whole(start_learner: StartLearner, tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "train").mkdir(parents=True)
    (source / "train" / "a.bin").write_bytes(b"a")
    (source / "labels.txt").write_text("cat\n")
    marker = tmp_path / "ran"

    learner = start_learner(
        (*LAUNCH, *MARKER_COMMAND, str(marker)),
        {DATA_URI: source.as_uri(), DATA_DIR: tmp_path / "data"},
    )

    assert learner.finish() == 0, learner.output()
    assert (tmp_path / "data" / "train" / "a.bin").read_bytes() == b"a"
    assert (tmp_path / "data" / "labels.txt").read_text() == "cat\n"
    assert marker.exists()


def test_an_http_source_is_downloaded_and_verified(
    start_learner: StartLearner, tmp_path: Path, http_base: str
) -> None:
    learner = start_learner(
        (*LAUNCH, *MARKER_COMMAND, str(tmp_path / "ran")),
        {DATA_URI: f"{http_base}/set.csv", DATA_SHA256: DIGEST, DATA_DIR: tmp_path / "data"},
    )

    assert learner.finish() == 0, learner.output()
    assert (tmp_path / "data" / "set.csv").read_bytes() == CONTENT
    assert (tmp_path / "ran").exists()


@pytest.mark.parametrize("scheme", ["file", "http"])
def test_a_checksum_mismatch_fails_downloading_and_the_command_never_runs(
    start_learner: StartLearner, tmp_path: Path, source: Path, http_base: str, scheme: str
) -> None:
    uri = source.as_uri() if scheme == "file" else f"{http_base}/set.csv"
    wrong = hashlib.sha256(b"other content").hexdigest()
    marker = tmp_path / "ran"

    learner = start_learner(
        (*LAUNCH, *MARKER_COMMAND, str(marker)),
        {DATA_URI: uri, DATA_SHA256: wrong, DATA_DIR: tmp_path / "data"},
    )

    assert learner.finish() == 1
    error = failed_downloading(learner)
    assert uri in error
    assert f"expected {wrong}, got {DIGEST}" in error
    assert not marker.exists()
    # Neither the file nor a partial temporary copy of it is left behind.
    assert list((tmp_path / "data").iterdir()) == []


def test_an_http_error_fails_downloading_with_the_url_and_the_status(
    start_learner: StartLearner, tmp_path: Path, http_base: str
) -> None:
    uri = f"{http_base}/missing.csv?token=secret"

    learner = start_learner(
        (*LAUNCH, *MARKER_COMMAND, str(tmp_path / "ran")),
        {DATA_URI: uri, DATA_DIR: tmp_path / "data"},
    )

    assert learner.finish() == 1
    # The query, which may hold a signature, is left out of the report.
    assert failed_downloading(learner) == (
        f"cannot fetch {http_base}/missing.csv?***: HTTP 404 Not Found"
    )
    assert not (tmp_path / "ran").exists()


def test_an_unreachable_server_fails_downloading_with_the_url_and_the_error(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    # A port that was free a moment ago: nothing listens there, so the connection is refused.
    uri = f"http://127.0.0.1:{free_port()}/set.csv"

    learner = start_learner(
        (*LAUNCH, *MARKER_COMMAND, str(tmp_path / "ran")),
        {DATA_URI: uri, DATA_DIR: tmp_path / "data"},
    )

    assert learner.finish() == 1
    error = failed_downloading(learner)
    assert error.startswith(f"cannot fetch {uri}: ")
    assert "refused" in error
    assert not (tmp_path / "ran").exists()


def test_a_missing_file_source_fails_downloading(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    uri = (tmp_path / "nowhere.csv").as_uri()

    learner = start_learner(
        (*LAUNCH, *MARKER_COMMAND, str(tmp_path / "ran")),
        {DATA_URI: uri, DATA_DIR: tmp_path / "data"},
    )

    assert learner.finish() == 1
    error = failed_downloading(learner)
    assert error.startswith(f"cannot fetch {uri}: ")
    assert "No such file or directory" in error


def test_an_unsupported_scheme_is_a_clear_error_before_anything_runs(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    learner = start_learner(
        (*LAUNCH, *MARKER_COMMAND, str(tmp_path / "ran")),
        {DATA_URI: "s3://bucket/set.csv", DATA_DIR: tmp_path / "data"},
    )

    assert learner.finish() == 1
    assert failed_downloading(learner) == (
        "invalid configuration: TRAINYARD_DATA_URI: unsupported URI scheme 's3' in "
        "'s3://bucket/set.csv' (supported: file, http, https)"
    )
    assert not (tmp_path / "ran").exists()
    assert not (tmp_path / "data").exists()


def test_a_results_location_that_cannot_be_written_fails_storing(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    uri = (blocker / "results").as_uri()

    learner = start_learner(
        python(WRITE_RESULT),
        {RESULTS_DIR: tmp_path / "results", RESULTS_URI: uri},
    )

    assert learner.finish() == 1
    assert trail(learner.messages)[-2:] == [("STORING", "started"), ("STORING", "failed")]
    error = learner.phase_ends()["STORING"].error
    assert error is not None
    assert error.startswith(f"cannot store results to {uri}: ")
    assert "Not a directory" in error


def test_an_output_directory_that_cannot_be_created_fails_processing(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    marker = tmp_path / "ran"

    learner = start_learner(
        (*LAUNCH, *MARKER_COMMAND, str(marker)), {CHECKPOINT_DIR: blocker / "checkpoints"}
    )

    assert learner.finish() == 1
    assert trail(learner.messages)[-1] == ("PROCESSING", "failed")
    error = learner.phase_ends()["PROCESSING"].error
    assert error is not None
    assert error.startswith(f"cannot create directory {blocker / 'checkpoints'}: ")
    assert not marker.exists()


def test_storing_replaces_the_results_of_an_earlier_attempt(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    destination = tmp_path / "store"
    destination.mkdir()
    (destination / "from-attempt-1.txt").write_text("old")

    learner = start_learner(
        python(WRITE_RESULT),
        {RESULTS_DIR: tmp_path / "results", RESULTS_URI: destination.as_uri()},
    )

    assert learner.finish() == 0, learner.output()
    assert [p.name for p in destination.iterdir()] == ["result.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_the_commands_exit_code_passes_through_and_nothing_is_stored(
    start_learner: StartLearner, tmp_path: Path
) -> None:
    learner = start_learner(
        python("import sys; sys.exit(3)"),
        {RESULTS_DIR: tmp_path / "results", RESULTS_URI: (tmp_path / "store").as_uri()},
    )

    assert learner.finish() == 3
    assert trail(learner.messages)[-1] == ("PROCESSING", "failed")
    processing = learner.phase_ends()["PROCESSING"]
    assert (processing.exit_code, processing.signal) == (3, None)
    assert processing.error == "command exited with code 3"
    assert not (tmp_path / "store").exists()


def test_a_command_killed_by_a_signal_is_reported_as_such(
    start_learner: StartLearner,
) -> None:
    learner = start_learner(python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))

    assert learner.finish() == 128 + signal.SIGKILL
    processing = learner.phase_ends()["PROCESSING"]
    assert (processing.outcome, processing.exit_code, processing.signal) == (
        "failed",
        None,
        "SIGKILL",
    )
    assert processing.error == "command was killed by SIGKILL"


def test_a_command_that_does_not_exist_fails_processing_with_status_127(
    start_learner: StartLearner,
) -> None:
    learner = start_learner((*LAUNCH, "no-such-trainer-command"))

    assert learner.finish() == 127
    error = learner.phase_ends()["PROCESSING"].error
    assert error is not None
    assert error.startswith("cannot run 'no-such-trainer-command': ")


@pytest.mark.parametrize("args", [(), ("--",), ("python", "train.py")])
def test_a_launch_without_a_command_after_double_dash_is_a_usage_error(
    start_learner: StartLearner, args: tuple[str, ...]
) -> None:
    learner = start_learner((PYTHON, "-m", "runners.launch", *args))

    assert learner.finish() == 2
    assert learner.messages == []
    assert "usage: python -m runners.launch -- COMMAND" in learner.stderr()


def test_sigterm_interrupts_a_stalled_download_and_leaves_no_partial_file(
    start_learner: StartLearner, tmp_path: Path, http_base: str
) -> None:
    learner = start_learner(
        (*LAUNCH, *MARKER_COMMAND, str(tmp_path / "ran")),
        {DATA_URI: f"{http_base}/stall", DATA_DIR: tmp_path / "data"},
    )
    learner.wait_for(lambda m: isinstance(m, PhaseStarted))
    assert _Routes.stalled.wait(timeout=60)

    learner.process.send_signal(signal.SIGTERM)

    assert learner.finish() == 128 + signal.SIGTERM
    assert trail(learner.messages) == [("DOWNLOADING", "started"), ("DOWNLOADING", "interrupted")]
    assert learner.phase_ends()["DOWNLOADING"].error == "interrupted by SIGTERM"
    assert list((tmp_path / "data").iterdir()) == []
    assert not (tmp_path / "ran").exists()
