"""The command line: help everywhere, clear errors and exit codes for bad input."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import failure, parser
from controlplane.composition import projections
from trainyard.api import ApiError

# Each test runs the trainyard command in a child interpreter.
pytestmark = pytest.mark.processes


def all_commands(command: argparse.ArgumentParser, path: list[str]) -> list[list[str]]:
    """Every command and subcommand, found by walking the parser (none can be forgotten)."""
    found = [path]
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += all_commands(sub, [*path, name])
    return found


COMMANDS = all_commands(parser(), [])


def trainyard(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "trainyard")
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args([*command, "--help"])
    assert exited.value.code == 0
    assert "usage: trainyard" in capsys.readouterr().out


def test_an_unreachable_database_is_one_line_and_exit_3() -> None:
    result = trainyard(
        "migrate", env={"TRAINYARD_DATABASE_URL": "postgresql://u:secret@127.0.0.1:9/x"}
    )
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("trainyard: cannot connect to the database at 127.0.0.1:9/x")
    assert "secret" not in result.stderr


def test_unknown_projection_is_a_usage_error(db_url: str) -> None:
    result = trainyard("projections", "rebuild", "nope", env={"TRAINYARD_DATABASE_URL": db_url})
    assert result.returncode == 2
    known = ", ".join(p.name for p in projections())
    assert f"no projection named 'nope' (known: {known})" in result.stderr


def test_rebuild_and_list_through_the_cli(db_url: str) -> None:
    env = {"TRAINYARD_DATABASE_URL": db_url}
    rebuilt = trainyard("projections", "rebuild", "streams", env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert rebuilt.stdout.strip() == "rebuilt streams from 0 events"
    listed = trainyard("projections", "list", env=env)
    assert listed.stdout.splitlines() == [f"{p.name}\tcaught up" for p in projections()]


def test_migrate_reports_an_up_to_date_database(db_url: str) -> None:
    result = trainyard("migrate", env={"TRAINYARD_DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    assert "is up to date" in result.stdout


def test_serve_refuses_an_unmigrated_database(empty_db_url: str) -> None:
    result = trainyard("serve", env={"TRAINYARD_DATABASE_URL": empty_db_url})
    assert result.returncode == 1
    assert "run `trainyard migrate` first" in result.stderr


def test_errors_are_one_line_and_debug_adds_the_traceback(tmp_path: Path) -> None:
    env = {"TRAINYARD_HOME": str(tmp_path), "TRAINYARD_TOKEN": "t"}
    target = ["--server", "http://127.0.0.1:9"]
    plain = trainyard("list", *target, env=env)
    assert plain.returncode == 3
    [line] = plain.stderr.splitlines()
    assert line.startswith("trainyard: cannot reach the server at http://127.0.0.1:9")
    debug = trainyard("--debug", "list", *target, env=env)
    assert debug.returncode == 3
    assert debug.stderr.splitlines()[0] == line
    assert "Traceback (most recent call last):" in debug.stderr
    assert "trainyard.api.ServerUnreachable" in debug.stderr


def test_a_usage_error_is_one_line_that_points_at_help() -> None:
    result = trainyard("list", "--limit", "lots")
    assert result.returncode == 2
    assert result.stderr == (
        "trainyard list: error: argument --limit: invalid int value: 'lots' "
        "(see `trainyard list --help`)\n"
    )
    assert trainyard("--debug", "nope").stderr.count("\n") == 1


def test_an_unexpected_error_is_one_line_that_offers_the_traceback() -> None:
    assert failure(RuntimeError("boom")) == (
        1,
        "unexpected error (RuntimeError: boom); run with --debug for the traceback",
    )
    assert failure(ApiError(422, "name: too long")) == (2, "name: too long")
    assert failure(ApiError(409, "exists")) == (1, "exists")


def test_the_configuration_table_names_every_flag() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    table = page.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    flags = {
        option
        for command in COMMANDS
        for action in _parser_of(command)._actions
        for option in action.option_strings
        if option not in {"-h", "--help"}
    }
    missing = sorted(flag for flag in flags if f"`{flag}" not in table and f" {flag}" not in table)
    assert missing == []


def _parser_of(command: list[str]) -> argparse.ArgumentParser:
    found = parser()
    for name in command:
        [subparsers] = [a for a in found._actions if isinstance(a, argparse._SubParsersAction)]
        found = subparsers.choices[name]
    return found


def test_a_token_as_an_argument_is_refused_with_what_to_use_instead(tmp_path: Path) -> None:
    env = {"TRAINYARD_HOME": str(tmp_path)}
    for command in (["list"], ["tenants", "list"], ["login"]):
        result = trainyard(
            *command, "--server", "http://127.0.0.1:9", "--token", "ty_s3cret", env=env
        )
        assert result.returncode == 2, command
        assert "use --token-file FILE or $TRAINYARD_TOKEN" in result.stderr
        assert "ty_s3cret" not in result.stderr


def test_the_token_comes_from_a_file(tmp_path: Path) -> None:
    """A file named by --token-file wins over the environment; an unreadable one is a usage
    error. (Here no server answers, so getting as far as calling it is the success.)"""
    token_file = tmp_path / "token"
    token_file.write_text("ty_from_file\n")
    env = {"TRAINYARD_HOME": str(tmp_path), "TRAINYARD_TOKEN": ""}
    target = ["--server", "http://127.0.0.1:9"]
    found = trainyard("list", *target, "--token-file", str(token_file), env=env)
    assert found.returncode == 3, found.stderr  # the server is unreachable: the token was found
    missing = trainyard("list", *target, env=env)
    assert missing.returncode == 2
    assert "pass --token-file FILE, set TRAINYARD_TOKEN" in missing.stderr
    unreadable = trainyard("list", *target, "--token-file", str(tmp_path / "nope"), env=env)
    assert unreadable.returncode == 2
    assert "cannot read the token from" in unreadable.stderr


def test_a_scale_database_prefix_that_is_not_an_identifier_is_refused_before_connecting() -> None:
    unreachable = {"TRAINYARD_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"}
    for prefix in ('x"; DROP DATABASE postgres; --', "Scale", "1st", "a" * 41, ""):
        result = trainyard("bench", "scale", "--database-prefix", prefix, env=unreachable)
        assert result.returncode == 2, prefix  # a usage error, not the database's exit 3
        assert "--database-prefix takes lowercase letters" in result.stderr


def test_without_the_benchmarks_bench_says_where_they_are() -> None:
    # An installed wheel has no bench/ (pyproject.toml): None in sys.modules hides the checkout's.
    code = "import sys; sys.modules['bench'] = None; from cli.main import main; sys.exit(main())"
    for words in (["bench", "api", "--json"], ["bench", "--help"]):
        result = subprocess.run(
            [sys.executable, "-c", code, *words], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2
        assert result.stderr == (
            "trainyard: the benchmarks run from a checkout of Trainyard's source, which the "
            "installed package leaves out: there, `pip install -e '.[bench]'`, then "
            "`trainyard bench NAME`\n"
        )
