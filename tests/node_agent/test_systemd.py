"""`trainyard agent install`: the unit systemd accepts, the secret that stays secret, and the
refusals that write nothing."""

from __future__ import annotations

import configparser
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.main import parser
from controlplane.failures import EXIT_USAGE
from node_agent.cli import cmd_agent, cmd_install, install
from node_agent.systemd import (
    UNIT_NAME,
    ServiceOptions,
    check_database_url,
    mask_password,
    render_env,
    render_unit,
)

# The tests run `trainyard agent install` and systemd-analyze as child processes.
pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "s3cr3t-Pa55"
URL = f"postgresql://trainyard:{PASSWORD}@db.example.com:5432/trainyard"


@pytest.fixture(autouse=True)
def no_image_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installing shell sets no TRAINYARD_IMAGES unless a test says so (conftest.py sets
    one for the control planes and agents the tests start)."""
    monkeypatch.delenv("TRAINYARD_IMAGES", raising=False)


def options(**changes: object) -> ServiceOptions:
    values: dict[str, object] = {
        "python": sys.executable,
        "name": "gpu-01",
        "runtime": "process",
        "heartbeat_s": 2.0,
        "ttl_s": 10.0,
        "grace_s": 10.0,
        "env_file": Path("/etc/trainyard/agent.env"),
    }
    values.update(changes)
    return ServiceOptions(**values)  # type: ignore[arg-type]


def sections(unit: str) -> configparser.ConfigParser:
    # strict: a setting given twice in one section is an error, as it would hide a mistake.
    parsed = configparser.ConfigParser(interpolation=None, strict=True)
    parsed.optionxform = str  # type: ignore[assignment,method-assign]
    parsed.read_string(unit)
    return parsed


def trainyard(
    *args: str, env: dict[str, str] | None = None, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    unset = ("TRAINYARD_DATABASE_URL", "TRAINYARD_AGENT_DATABASE_URL")
    base = {k: v for k, v in os.environ.items() if k not in unset}
    # As another user the checkout is read-only: no bytecode caches to write.
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    prefix: list[str] = []
    if user is not None:
        prefix = ["setpriv", f"--reuid={user}", f"--regid={user_gid(user)}", "--clear-groups"]
    return subprocess.run(
        [*prefix, sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        cwd=REPO,
        timeout=60,
    )


def user_gid(user: str) -> int:
    return pwd.getpwnam(user).pw_gid


def url_file(factory: pytest.TempPathFactory, url: str) -> str:
    """A file holding `url`, outside the directory the test checks is left untouched."""
    path = factory.mktemp("secret") / "database-url"
    path.write_text(url + "\n")
    return str(path)


def test_a_database_url_as_an_argument_is_refused_with_what_to_use_instead(
    tmp_path: Path,
) -> None:
    result = trainyard("agent", "install", "--database-url", URL, "--unit-dir", str(tmp_path))
    assert result.returncode == 2
    assert "--database-url-file FILE or $TRAINYARD_AGENT_DATABASE_URL" in result.stderr
    assert PASSWORD not in result.stderr
    assert files_under(tmp_path) == []


def files_under(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if not p.is_dir())


# --- the unit -----------------------------------------------------------------------------


def test_the_unit_has_every_setting_a_dependable_agent_needs() -> None:
    unit = sections(render_unit(options(grace_s=25.0)))
    assert unit["Unit"]["After"].split() == ["network-online.target"]
    assert unit["Unit"]["Wants"].split() == ["network-online.target"]
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"
    service = unit["Service"]
    assert service["Restart"] == "always"
    assert int(service["RestartSec"]) > 0
    assert service["KillMode"] == "process"
    assert int(service["TimeoutStopSec"]) > 25
    assert service["EnvironmentFile"] == "/etc/trainyard/agent.env"
    assert service["Type"] == "exec"
    assert shlex.split(service["ExecStart"])[:4] == [
        sys.executable,
        "-m",
        "cli",
        "agent",
    ]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_a_docker_agent_starts_after_docker_and_wants_it() -> None:
    unit = sections(render_unit(options(runtime="docker")))
    assert unit["Unit"]["After"].split() == ["network-online.target", "docker.service"]
    assert unit["Unit"]["Wants"].split() == ["network-online.target", "docker.service"]
    assert "--runtime docker" in unit["Service"]["ExecStart"]


def test_an_agent_that_picks_its_runtime_starts_after_docker_and_passes_no_runtime() -> None:
    unit = sections(render_unit(options(runtime=None, allow_network=("acme", "globex"))))
    assert unit["Unit"]["After"].split() == ["network-online.target", "docker.service"]
    words = shlex.split(unit["Service"]["ExecStart"])
    assert "--runtime" not in words
    args = parser().parse_args(words[3:])
    assert (args.runtime, args.allow_network) == (None, ["acme", "globex"])


def test_the_unit_passes_allow_privileged_login_only_when_asked() -> None:
    for allowed in (False, True):
        words = shlex.split(
            sections(render_unit(options(allow_privileged_login=allowed)))["Service"]["ExecStart"]
        )
        assert parser().parse_args(words[3:]).allow_privileged_login is allowed


def test_a_process_agent_does_not_wait_for_docker() -> None:
    unit = sections(render_unit(options(runtime="process")))
    assert unit["Unit"]["After"].split() == ["network-online.target"]


def test_exec_start_is_an_agent_command_line_with_the_same_options() -> None:
    unit = sections(
        render_unit(
            options(
                fake_gpus=2,
                cpus=7.5,
                memory_mb=4096,
                work_dir=Path("/srv/learners"),
                checkpoint_dir=Path("/mnt/checkpoints"),
                heartbeat_s=1.5,
                ttl_s=6.0,
                grace_s=20.0,
            )
        )
    )
    words = shlex.split(unit["Service"]["ExecStart"])
    args = parser().parse_args(words[3:])
    assert args.handler is cmd_agent
    assert (args.name, args.runtime, args.fake_gpus) == ("gpu-01", "process", 2)
    assert (args.cpus, args.memory_mb, args.work_dir) == (7.5, 4096, Path("/srv/learners"))
    assert args.checkpoint_dir == Path("/mnt/checkpoints")
    assert (args.heartbeat, args.ttl, args.grace) == (1.5, 6.0, 20.0)


def test_unset_cpus_and_memory_are_left_for_the_agent_to_measure_when_it_starts() -> None:
    exec_start = sections(render_unit(options()))["Service"]["ExecStart"]
    assert "--cpus" not in exec_start
    assert "--memory-mb" not in exec_start


def test_the_unit_never_holds_the_database_url() -> None:
    assert "postgresql" not in render_unit(options())


# --- systemd-analyze verify -----------------------------------------------------------------

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is not installed (apt-get install systemd; ./dev test installs it)",
)


def verify(unit: str, directory: Path) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    path = directory / UNIT_NAME
    path.write_text(unit)
    return subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60
    )


@needs_systemd_analyze
@pytest.mark.parametrize(
    "service",
    [
        options(),
        options(runtime="docker", fake_gpus=4, cpus=30.0, memory_mb=200_000, grace_s=300.0),
        # Spaces, quotes, a backslash, a %-specifier and a $VARIABLE must all stay literal.
        options(name='odd "node" %h $HOME \\x', work_dir=Path("/srv/a b/%i")),
    ],
    ids=["process", "docker", "odd-words"],
)
def test_systemd_analyze_verify_accepts_the_unit(service: ServiceOptions, tmp_path: Path) -> None:
    # ExecStart= is this interpreter: verify checks that the binary exists and is executable.
    result = verify(render_unit(service), tmp_path)
    assert result.returncode == 0, result.stderr
    # verify only warns (exit 0) about a setting it cannot parse: any output is a failure.
    assert result.stdout + result.stderr == ""


@needs_systemd_analyze
def test_verify_as_used_here_does_catch_a_bad_unit(tmp_path: Path) -> None:
    bad = render_unit(options()).replace("KillMode=process", "KillMode=procss")
    result = verify(bad, tmp_path)
    assert "kill mode" in result.stdout + result.stderr


# --- the environment file -------------------------------------------------------------------


def test_the_environment_file_reads_back_exactly_even_with_shell_characters(
    tmp_path: Path,
) -> None:
    tricky = 'postgresql://u:p"a$s`w\\d%20x@db/trainyard?sslmode=require'
    path = tmp_path / "agent.env"
    path.write_text(render_env(tricky, Path("/var/lib/trainyard")))
    # systemd's EnvironmentFile= and a POSIX shell read double-quoted values alike.
    shown = subprocess.run(
        ["sh", "-c", 'set -a; . "$1"; printf "%s\\n%s" "$TRAINYARD_DATABASE_URL" '
         '"$TRAINYARD_HOME"', "sh", str(path)],
        capture_output=True,
        text=True,
        env={},
        check=True,
    )  # fmt: skip
    assert shown.stdout == f"{tricky}\n/var/lib/trainyard"


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (URL, "postgresql://trainyard:***@db.example.com:5432/trainyard"),
        ("postgresql://u:p%40ss@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db"),
        ("postgresql://db/x?user=u&password=hunter2&sslmode=require",
         "postgresql://db/x?user=u&password=***&sslmode=require"),
        ("postgresql://u@db/x", "postgresql://u@db/x"),
        ("postgresql:///x?host=/run/postgresql", "postgresql:///x?host=/run/postgresql"),
    ],
)  # fmt: skip
def test_mask_password(url: str, masked: str) -> None:
    assert mask_password(url) == masked


@pytest.mark.parametrize("url", ["mysql://u:p@db/x", "dbhost:5432", "postgresql://h:x/"])
def test_a_url_that_is_not_postgres_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_database_url(url)
    assert url not in str(refused.value)


# --- the command ----------------------------------------------------------------------------


@pytest.fixture
def world_writable() -> Iterator[Path]:
    """A directory anyone may write to, outside pytest's root-only tmp_path: so that a refusal
    to a non-root user is the command's doing, not the file system's."""
    with tempfile.TemporaryDirectory(prefix="trainyard-install-") as name:
        os.chmod(name, 0o1777)
        yield Path(name)


def test_agent_options_still_run_the_agent_and_may_come_before_install() -> None:
    args = parser().parse_args(["agent", "--name", "x", "--fake-gpus", "1"])
    assert args.handler is cmd_agent
    assert (args.name, args.fake_gpus, args.runtime, args.grace) == ("x", 1, None, 10.0)
    before = parser().parse_args(["agent", "--name", "x", "--grace", "30", "install"])
    assert before.handler is cmd_install
    assert (before.name, before.grace, before.ttl) == ("x", 30.0, 10.0)
    after = parser().parse_args(["agent", "--name", "x", "install", "--name", "y"])
    assert after.name == "y"


def test_dry_run_prints_both_files_with_the_password_masked_and_writes_nothing(
    tmp_path: Path,
) -> None:
    env_file = tmp_path / "etc" / "agent.env"
    result = trainyard(
        "agent", "install", "--name", "gpu-07", "--runtime", "docker", "--dry-run",
        "--unit-dir", str(tmp_path / "units"), "--env-file", str(env_file),
        env={"TRAINYARD_AGENT_DATABASE_URL": URL},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"# {tmp_path / 'units' / UNIT_NAME}\n" in out
    assert "KillMode=process" in out
    assert f"EnvironmentFile={env_file}" in out
    assert "--name gpu-07 --runtime docker" in out
    # Which runtime runs tenants' code, and as whom.
    assert "# runtime docker: tenants' code runs in Docker containers" in out
    assert "each job as its own uid (200000-265535)" in out
    assert f"# {env_file} (mode 0600" in out
    assert (
        'TRAINYARD_DATABASE_URL="postgresql://trainyard:***@db.example.com:5432/trainyard"' in out
    )
    assert 'TRAINYARD_HOME="/var/lib/trainyard"' in out
    assert PASSWORD not in out + result.stderr
    assert files_under(tmp_path) == []


def test_without_root_install_says_so_and_writes_nothing(world_writable: Path) -> None:
    # The real thing: a process whose effective uid is not 0. Run as root, the suite drops to
    # `nobody` with setpriv; run as anyone else, it already is such a process.
    user = "nobody" if os.geteuid() == 0 else None
    if user is not None and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): cannot drop to nobody")
    result = trainyard(
        "agent", "install",
        "--unit-dir", str(world_writable / "units"),
        "--env-file", str(world_writable / "etc" / "agent.env"),
        env={"TRAINYARD_AGENT_DATABASE_URL": URL},
        user=user,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("trainyard agent install: must run as root to write ")
    assert "nothing was written" in lines[0]
    assert PASSWORD not in result.stderr
    assert files_under(world_writable) == []


def test_the_root_check_comes_after_the_input_is_known_good(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    env_file = tmp_path / "agent.env"
    args = parser().parse_args(
        ["agent", "install", "--database-url-file", url_file(tmp_path_factory, URL),
         "--unit-dir", str(tmp_path), "--env-file", str(env_file)]
    )  # fmt: skip
    assert install(args, {}, running_as_root=False) == 1
    assert "must run as root" in capsys.readouterr().err
    assert files_under(tmp_path) == []


def test_as_root_install_writes_the_unit_and_a_0600_environment_file(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    units, env_file = tmp_path / "units", tmp_path / "etc" / "trainyard" / "agent.env"
    args = parser().parse_args(
        ["agent", "install", "--name", "gpu-03", "--fake-gpus", "8", "--home", "/srv/ty",
         "--database-url-file", url_file(tmp_path_factory, URL),
         "--unit-dir", str(units), "--env-file", str(env_file)]
    )  # fmt: skip
    assert install(args, {}, running_as_root=True) == 0

    unit_path = units / UNIT_NAME
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(unit_path.stat().st_mode) == 0o644
    assert files_under(tmp_path) == sorted([unit_path, env_file])  # no temporary files left
    assert env_file.read_text() == render_env(URL, Path("/srv/ty"))
    service = sections(unit_path.read_text())["Service"]
    assert service["EnvironmentFile"] == str(env_file)
    assert "--name gpu-03 --fake-gpus 8" in service["ExecStart"]

    out = capsys.readouterr()
    assert out.out.splitlines() == [
        f"wrote {unit_path}",
        f"wrote {env_file} (mode 0600)",
        "runtime chosen as it starts: tenants' code runs in Docker containers (no privileges, "
        "no network unless allowed) if an engine answers as the agent starts, else as "
        "processes on this machine, each job as its own uid (200000-265535) (the service "
        "runs as root)",
        "next: systemctl daemon-reload && systemctl enable --now trainyard-agent",
    ]
    assert PASSWORD not in out.out + out.err


def test_reinstalling_replaces_both_files_and_tightens_a_loose_environment_file(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    units, env_file = tmp_path / "units", tmp_path / "agent.env"
    units.mkdir()
    (units / UNIT_NAME).write_text("old unit\n")
    env_file.write_text("TRAINYARD_DATABASE_URL=old\n")
    env_file.chmod(0o644)
    new_url = URL.replace(PASSWORD, "rotated")
    args = parser().parse_args(["agent", "install", "--grace", "60",
                                "--database-url-file", url_file(tmp_path_factory, new_url),
                                "--unit-dir", str(units), "--env-file", str(env_file)])  # fmt: skip
    assert install(args, {}, running_as_root=True) == 0
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert "rotated" in env_file.read_text()
    assert "--grace 60" in (units / UNIT_NAME).read_text()
    assert "rotated" not in capsys.readouterr().out


def test_install_passes_the_shells_opentelemetry_settings_to_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_AGENT_DATABASE_URL", URL)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cret")
    env_file = tmp_path / "agent.env"
    options = ["agent", "install", "--unit-dir", str(tmp_path / "units"),
               "--env-file", str(env_file)]  # fmt: skip
    assert install(parser().parse_args(options), os.environ, running_as_root=True) == 0
    written = env_file.read_text().splitlines()
    assert 'OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318"' in written
    assert 'OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer s3cret"' in written
    capsys.readouterr()
    dry_run = parser().parse_args([*options, "--dry-run"])
    assert install(dry_run, os.environ, running_as_root=True) == 0
    shown = capsys.readouterr().out
    assert 'OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318"' in shown
    assert 'OTEL_EXPORTER_OTLP_HEADERS="****"' in shown and "s3cret" not in shown


def test_install_passes_the_shells_image_allowlist_to_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env_file = tmp_path / "agent.env"
    options = ["agent", "install", "--unit-dir", str(tmp_path / "units"),
               "--env-file", str(env_file)]  # fmt: skip
    settings = os.environ
    monkeypatch.setenv("TRAINYARD_AGENT_DATABASE_URL", URL)
    monkeypatch.setenv("TRAINYARD_IMAGES", "x@sha256:1")
    assert install(parser().parse_args(options), settings, running_as_root=True) == EXIT_USAGE
    assert "TRAINYARD_IMAGES" in capsys.readouterr().err
    assert not env_file.exists()
    monkeypatch.setenv("TRAINYARD_IMAGES", "trainyard-learner:latest,vision/*")
    assert install(parser().parse_args(options), settings, running_as_root=True) == 0
    assert 'TRAINYARD_IMAGES="trainyard-learner:latest,vision/*"' in env_file.read_text()


def test_install_without_a_database_url_is_a_usage_error_that_writes_nothing(
    tmp_path: Path,
) -> None:
    # $TRAINYARD_DATABASE_URL is the operator's (the owner's) URL: never written for an agent.
    result = trainyard(
        "agent", "install", "--unit-dir", str(tmp_path), "--env-file", str(tmp_path / "a.env"),
        env={"TRAINYARD_DATABASE_URL": URL},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("trainyard agent install: error: no database: pass ")
    assert "trainyard agent-login create NAME --node NODE --password-file FILE" in result.stderr
    assert "TRAINYARD_AGENT_DATABASE_URL" in result.stderr
    assert PASSWORD not in result.stderr
    assert files_under(tmp_path) == []


def test_install_takes_the_agent_logins_url_from_its_own_variable(tmp_path: Path) -> None:
    env_file = tmp_path / "agent.env"
    result = trainyard(
        "agent", "install", "--dry-run", "--unit-dir", str(tmp_path), "--env-file", str(env_file),
        env={"TRAINYARD_AGENT_DATABASE_URL": URL, "TRAINYARD_DATABASE_URL": "postgresql://owner@x/y"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert 'TRAINYARD_DATABASE_URL="postgresql://trainyard:***@db.example.com' in result.stdout
    assert "owner" not in result.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--ttl", "2", "--heartbeat", "2"], "--ttl must be longer than --heartbeat"),
        (["--fake-gpus", "-1"], "--fake-gpus must be >= 0"),
        (["--env-file", "relative.env"], "--env-file must be an absolute path"),
        (["--database-url-file", f"mysql://u:{PASSWORD}@db/x"], "must start with postgresql://"),
        (["--database-url-file", "/nonexistent/url"], "cannot read the database URL"),
        (["--database-url-file", ""], "holds no database URL"),
    ],
)
def test_bad_install_options_are_usage_errors_that_write_nothing(
    extra: list[str],
    message: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TRAINYARD_AGENT_DATABASE_URL", URL)
    if extra[0] == "--database-url-file" and not extra[1].startswith("/"):
        extra = [extra[0], url_file(tmp_path_factory, extra[1])]  # the file holds this text
    args = parser().parse_args(["agent", "install", "--unit-dir", str(tmp_path), *extra])
    assert install(args, os.environ, running_as_root=True) == 2
    err = capsys.readouterr().err
    assert message in err
    assert PASSWORD not in err
    assert files_under(tmp_path) == []


def test_install_carries_the_roots_and_learner_uids_into_the_environment_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The service's agent checks file:// locations against the same roots as the control
    # plane, and runs jobs as the operator's uids.
    monkeypatch.setenv("TRAINYARD_RESULTS_ROOTS", "/srv/results/{tenant}")
    monkeypatch.setenv("TRAINYARD_LEARNER_UIDS", "300000:1000")
    monkeypatch.setenv("TRAINYARD_AGENT_DATABASE_URL", URL)
    env_file = tmp_path / "agent.env"
    options = ["agent", "install", "--unit-dir", str(tmp_path / "units"),
               "--env-file", str(env_file)]  # fmt: skip
    settings = os.environ
    assert install(parser().parse_args(options), settings, running_as_root=True) == 0
    written = env_file.read_text().splitlines()
    assert 'TRAINYARD_RESULTS_ROOTS="/srv/results/{tenant}"' in written
    assert 'TRAINYARD_LEARNER_UIDS="300000:1000"' in written
    assert "each job as its own uid (300000-300999)" in capsys.readouterr().out
    # A bad setting is a usage error, and nothing is written.
    monkeypatch.setenv("TRAINYARD_LEARNER_UIDS", "0:10")
    other = tmp_path / "other"
    bad = [*options[:-1], str(other / "agent.env")]
    assert install(parser().parse_args(bad), settings, running_as_root=True) == 2
    assert "TRAINYARD_LEARNER_UIDS must be START:COUNT" in capsys.readouterr().err
    assert not other.exists()
