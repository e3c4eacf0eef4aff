"""`trainyard agent install`: the systemd unit and environment file that run an agent as a
service. Rendering is pure (options in, text out); writing is one small atomic helper."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from controlplane.agent_port.vocabulary import IMAGES_ENV, ImageAllowlist

UNIT_NAME = "trainyard-agent.service"
DEFAULT_UNIT_DIR = Path("/etc/systemd/system")
DEFAULT_ENV_FILE = Path("/etc/trainyard/agent.env")
DEFAULT_HOME = Path("/var/lib/trainyard")
ENV_FILE_MODE = 0o600
UNIT_FILE_MODE = 0o644
RESTART_S = 1
STOP_MARGIN_S = 30
"""Seconds past --grace that systemd waits for the agent to stop: after its learners have
ended it still ships their last log lines and deregisters the node."""

MASK = "***"

# Words systemd takes as they are in ExecStart=; anything else is double-quoted.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class InstallError(ValueError):
    """Options that cannot make a working service (a usage error)."""


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    """What the unit runs: the agent's own options, plus where its environment file lies."""

    python: str
    """Absolute path of the interpreter that has Trainyard installed (its venv's, unresolved:
    resolving a venv's symlink would lose the venv)."""
    name: str
    runtime: str | None
    """None: the agent picks docker when an engine answers as it starts, else process."""
    heartbeat_s: float
    ttl_s: float
    grace_s: float
    env_file: Path = DEFAULT_ENV_FILE
    fake_gpus: int | None = None
    cpus: float | None = None
    """None: the agent offers all of the machine's CPUs, counted each time it starts."""
    memory_mb: int | None = None
    """None: the agent offers all of the machine's memory, measured each time it starts."""
    work_dir: Path | None = None
    allow_network: tuple[str, ...] = ()
    """Tenants whose learners may use the network."""
    checkpoint_dir: Path | None = None
    allow_privileged_login: bool = False
    """Whether the agent starts with a login that has more than the agent role."""
    wake: str = "listen"
    """How the agent is woken: "listen" (a LISTEN connection) or "poll"."""
    poll_s: float = 1.0
    node_address: str | None = None
    """This node's address on the cluster network (`--node-address`); None: none."""
    job_network: str | None = None
    """The cluster's range of jobs' addresses (`--job-network`); None: the agent's default."""
    serving_listen: str | None = None
    """Where its serving channel listens (`--serving-listen`); None: the agent's default."""
    warm: int = 0
    """Warm sandboxes kept ready (`--warm`)."""
    warm_imports: tuple[str, ...] = ()
    """What they import ahead (`--warm-import`)."""


def agent_command(opts: ServiceOptions) -> list[str]:
    """The agent's command line, with the same flags `trainyard agent` takes."""
    words = [opts.python, "-m", "cli", "agent", "--name", opts.name]
    if opts.runtime is not None:
        words += ["--runtime", opts.runtime]
    if opts.fake_gpus is not None:
        words += ["--fake-gpus", str(opts.fake_gpus)]
    if opts.cpus is not None:
        words += ["--cpus", _number(opts.cpus)]
    if opts.memory_mb is not None:
        words += ["--memory-mb", str(opts.memory_mb)]
    if opts.work_dir is not None:
        words += ["--work-dir", str(opts.work_dir)]
    for tenant in opts.allow_network:
        words += ["--allow-network", tenant]
    if opts.checkpoint_dir is not None:
        words += ["--checkpoint-dir", str(opts.checkpoint_dir)]
    words += ["--heartbeat", _number(opts.heartbeat_s), "--ttl", _number(opts.ttl_s)]
    words += ["--grace", _number(opts.grace_s)]
    words += ["--wake", opts.wake, "--poll", _number(opts.poll_s)]
    if opts.node_address is not None:
        words += ["--node-address", opts.node_address]
    if opts.job_network is not None:
        words += ["--job-network", opts.job_network]
    if opts.serving_listen is not None:
        words += ["--serving-listen", opts.serving_listen]
    if opts.warm:
        words += ["--warm", str(opts.warm)]
    for module in opts.warm_imports:
        words += ["--warm-import", module]
    if opts.allow_privileged_login:
        words.append("--allow-privileged-login")
    return words


def render_unit(opts: ServiceOptions) -> str:
    """The text of trainyard-agent.service."""
    _check_path("--env-file", opts.env_file)
    if not os.path.isabs(opts.python):
        raise InstallError(f"the interpreter path must be absolute, not {opts.python!r}")
    for word in agent_command(opts):
        if _CONTROL.search(word):
            raise InstallError(f"control characters cannot go into a unit file: {word!r}")
    after = ["network-online.target"]
    needs = "Postgres over the network"
    # Unless told to run processes, the agent looks for Docker as it starts: after Docker,
    # where the machine has it (an absent unit is no error).
    if opts.runtime != "process":
        after.append("docker.service")
        needs += ", and Docker for its learners"
    grace = _number(opts.grace_s)
    stop_s = _ceil(opts.grace_s) + STOP_MARGIN_S
    exec_start = " ".join(_exec_word(word) for word in agent_command(opts))
    return f"""\
# Written by `trainyard agent install`. To change it, run that command again with new options,
# then `systemctl daemon-reload && systemctl restart trainyard-agent`.
[Unit]
Description=Trainyard node agent {_specifiers(opts.name)}
# The agent needs {needs}.
# Wants=, not Requires=: a restart of {" or ".join(after)}
# must not stop the agent.
Wants={" ".join(after)}
After={" ".join(after)}
# Never stop retrying: an agent that stays down strands this machine's GPUs.
StartLimitIntervalSec=0

[Service]
# exec: `systemctl start` fails at once if the interpreter cannot be run.
Type=exec
# TRAINYARD_DATABASE_URL (with its password) and TRAINYARD_HOME; mode 0600, root only.
EnvironmentFile={_specifiers(str(opts.env_file))}
# Unbuffered, so that the agent's lines reach the journal as they are written.
Environment=PYTHONUNBUFFERED=1
ExecStart={exec_start}
Restart=always
# A restarted agent keeps its identity (in --work-dir), so it takes its lease back at once and
# re-adopts the learners it left running: restart promptly, but not in a tight loop.
RestartSec={RESTART_S}
# process: systemd signals only the agent, never its learners. On `systemctl stop` the agent
# itself stops them in order (SIGTERM, --grace seconds to checkpoint, SIGKILL) and re-queues
# their jobs. When the agent dies instead (a crash, an OOM kill), systemd restarts it and
# leaves its learners running: hours of training are not thrown away with the agent, and the
# agent can re-adopt them (the design: learners keep running while their agent restarts).
KillMode=process
# --grace ({grace} s) for the learners to stop, then {STOP_MARGIN_S} s to ship their
# last log lines and deregister, before systemd kills the agent.
TimeoutStopSec={stop_s}

[Install]
WantedBy=multi-user.target
"""


def render_env(database_url: str, home: Path, telemetry: Mapping[str, str] | None = None) -> str:
    """The text of the environment file (the caller masks the URL and the telemetry's
    secrets before printing it); `telemetry` holds OTEL_* settings for the agent's export, and
    the other settings carried over from the installing shell (`images_env`)."""
    _check_path("--home", home)
    if _CONTROL.search(database_url):
        raise InstallError("the database URL contains control characters")
    extra = sorted((telemetry or {}).items())
    for name, value in extra:
        if _CONTROL.search(value) or not _ENV_NAME.fullmatch(name):
            raise InstallError(f"${name} cannot go into the environment file")
    return (
        "# Written by `trainyard agent install`; read by trainyard-agent.service.\n"
        "# Mode 0600: it holds the database password.\n"
        f"TRAINYARD_DATABASE_URL={_env_value(database_url)}\n"
        f"TRAINYARD_HOME={_env_value(str(home))}\n"
        + "".join(f"{name}={_env_value(value)}\n" for name, value in extra)
    )


def telemetry_env(environ: Mapping[str, str], *, masked: bool = False) -> dict[str, str]:
    """The installing shell's OpenTelemetry settings (OTEL_*: the OTLP endpoint, its headers,
    the service name ...), so that the service exports where the operator said; `masked` hides
    the headers, which may hold credentials."""
    return {
        name: "****" if masked and "HEADERS" in name else value
        for name, value in environ.items()
        if name.startswith("OTEL_")
    }


def images_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The installing shell's TRAINYARD_IMAGES, so that the service admits the learner images
    the operator allows (unset: none, and the agent's default applies); InstallError naming it
    when it is malformed (the agent would refuse to start)."""
    value = environ.get(IMAGES_ENV)
    if not value:
        return {}
    try:
        ImageAllowlist.from_env(environ)
    except ValueError as exc:
        raise InstallError(str(exc)) from None
    return {IMAGES_ENV: value}


def check_database_url(url: str) -> None:
    """A Postgres URL, or InstallError (whose message never holds the password)."""
    try:
        parts = urlsplit(url)
        # Each host of libpq's multi-host form (h1:5432,h2:5432, for a replicated database:
        # docs/failover.md) on its own: parsing its port is the check, a bad one raises here.
        for host in parts.netloc.rpartition("@")[2].split(","):
            urlsplit(f"//{host}").port  # noqa: B018
    except ValueError as exc:
        raise InstallError(f"the database URL cannot be parsed ({exc})") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise InstallError(
            "the database URL must start with postgresql:// (for example "
            "postgresql://trainyard:PASSWORD@db.example.com:5432/trainyard)"
        )


def mask_password(url: str) -> str:
    """The URL with its password (in the authority or a `password=` parameter) replaced."""
    parts = urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if parts.password is None and "password=" not in query:
        return url
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:{MASK}@{hostport}"
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(key == "password" for key, _ in pairs):
        masked = [(key, MASK if key == "password" else value) for key, value in pairs]
        query = urlencode(masked, safe=MASK, quote_via=quote)
    # Not urlunsplit: it drops the empty authority of postgresql:///db?host=/run/postgresql.
    masked_url = f"{parts.scheme}://{netloc}{parts.path}"
    return masked_url + (f"?{query}" if query else "")


def write_atomically(path: Path, text: str, mode: int) -> None:
    """Replace `path` with `text` so that readers see the old file or the new one, never a
    part; the new file has `mode` from its creation (a secret is never briefly readable)."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    # The rename itself survives a crash only once the directory is on disk.
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _check_path(option: str, path: Path) -> None:
    if not path.is_absolute():
        raise InstallError(f"{option} must be an absolute path, not {str(path)!r}")
    if _CONTROL.search(str(path)) or any(c.isspace() for c in str(path)):
        raise InstallError(f"{option} cannot contain spaces or control characters: {str(path)!r}")


def _number(value: float) -> str:
    return format(value, "g")


def _ceil(value: float) -> int:
    return -int(-value // 1)


def _specifiers(text: str) -> str:
    """systemd expands %-specifiers in most settings; a literal % is %%."""
    return text.replace("%", "%%")


def _exec_word(word: str) -> str:
    """One ExecStart= word: %-specifiers and $VARIABLES escaped, quoted unless plain."""
    escaped = _specifiers(word).replace("$", "$$")
    if _PLAIN_WORD.fullmatch(word):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _env_value(value: str) -> str:
    """A double-quoted value that systemd's EnvironmentFile= and a POSIX shell both read back
    as `value`: inside double quotes both take a backslash before " \\ ` $ as an escape."""
    escaped = "".join("\\" + c if c in '"\\`$' else c for c in value)
    return f'"{escaped}"'
