"""The agent's pooler options as `trainyard agent install` writes them: --wake and --poll into
the unit's command line, the shell's TRAINYARD_POOLER_URL into the environment file (masked when
printed), and the refusals that write nothing."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from cli.main import parser
from controlplane.failures import EXIT_USAGE
from node_agent.cli import POOLER_URL_ENV, install
from node_agent.systemd import UNIT_NAME

PASSWORD = "s3cr3t-Pa55"
URL = f"postgresql://ty_gpu_01:{PASSWORD}@db.example.com:5432/trainyard"
POOLER = f"postgresql://ty_gpu_01:{PASSWORD}@pgbouncer.example.com:6432/trainyard"


@pytest.fixture(autouse=True)
def agent_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_AGENT_DATABASE_URL", URL)
    for name in ("TRAINYARD_IMAGES", "TRAINYARD_LEARNER_UIDS", POOLER_URL_ENV):
        monkeypatch.delenv(name, raising=False)


def options(tmp_path: Path, *extra: str) -> list[str]:
    return ["agent", "install", "--unit-dir", str(tmp_path / "units"),
            "--env-file", str(tmp_path / "agent.env"), *extra]  # fmt: skip


def test_install_writes_the_wake_and_poll_into_the_units_command(tmp_path: Path) -> None:
    args = parser().parse_args(options(tmp_path, "--wake", "poll", "--poll", "5"))
    assert install(args, os.environ, running_as_root=True) == 0
    exec_start = next(
        line.removeprefix("ExecStart=")
        for line in (tmp_path / "units" / UNIT_NAME).read_text().splitlines()
        if line.startswith("ExecStart=")
    )
    words = shlex.split(exec_start)
    assert words[words.index("--wake") + 1] == "poll"
    assert words[words.index("--poll") + 1] == "5"
    # What the unit runs parses as the same options.
    again = parser().parse_args(words[words.index("agent") :])
    assert again.wake == "poll" and again.poll == 5.0


def test_install_carries_the_shells_pooler_url_and_masks_it_when_printing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(POOLER_URL_ENV, POOLER)
    assert install(parser().parse_args(options(tmp_path)), os.environ, running_as_root=True) == 0
    written = (tmp_path / "agent.env").read_text().splitlines()
    assert f'{POOLER_URL_ENV}="{POOLER}"' in written
    capsys.readouterr()
    dry_run = parser().parse_args(options(tmp_path / "dry", "--dry-run"))
    assert install(dry_run, os.environ, running_as_root=True) == 0
    shown = capsys.readouterr().out
    assert f'{POOLER_URL_ENV}="postgresql://ty_gpu_01:***@pgbouncer.example.com' in shown
    assert PASSWORD not in shown


@pytest.mark.parametrize(
    ("extra", "pooler", "message"),
    [
        (["--poll", "0"], None, "--poll must be > 0"),
        ([], f"mysql://u:{PASSWORD}@pgbouncer/x", "must start with postgresql://"),
    ],
)
def test_bad_pooler_options_are_usage_errors_that_write_nothing(
    extra: list[str],
    pooler: str | None,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if pooler is not None:
        monkeypatch.setenv(POOLER_URL_ENV, pooler)
    args = parser().parse_args(options(tmp_path, *extra))
    assert install(args, os.environ, running_as_root=True) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and PASSWORD not in err
    assert not (tmp_path / "units").exists() and not (tmp_path / "agent.env").exists()


def test_wake_takes_listen_or_poll_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(["agent", "--wake", "notify"])
    assert exit_.value.code == EXIT_USAGE
    assert "invalid choice: 'notify'" in capsys.readouterr().err
