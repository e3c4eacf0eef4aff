"""`trainyard agent`: run a node agent until SIGINT or SIGTERM; `trainyard agent install`:
write the systemd unit that runs one as a service."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controlplane.agent_port.startup import (
    AGENT_ROLE,
    RefusedSecret,
    Settings,
    default_root,
    login_excess,
    login_node,
    read_secret_file,
    require_migrated,
    resolve_database,
    setup_telemetry,
)
from controlplane.agent_port.vocabulary import (
    DATA_ROOTS_ENV,
    EXIT_FAILED,
    EXIT_USAGE,
    RESULTS_ROOTS_ENV,
    ImageAllowlist,
    Roots,
)
from node_agent.agent import AgentConfig
from node_agent.folders import unreachable_for_learners
from node_agent.job_links import DEFAULT_RANGE, JOB_PREFIX, AddressPlan, parse_address
from node_agent.runtimes import RUNTIMES, docker_answers
from node_agent.service import run_agent
from node_agent.serving_channel import DEFAULT_LISTEN, SERVING_OFF, parse_listen
from node_agent.systemd import (
    DEFAULT_ENV_FILE,
    DEFAULT_HOME,
    DEFAULT_UNIT_DIR,
    ENV_FILE_MODE,
    UNIT_FILE_MODE,
    UNIT_NAME,
    InstallError,
    ServiceOptions,
    check_database_url,
    images_env,
    mask_password,
    render_env,
    render_unit,
    telemetry_env,
    write_atomically,
)
from node_agent.users import LEARNER_UIDS_ENV, UidRange

log = logging.getLogger("node_agent")

WAKES = ("listen", "poll")
POOLER_URL_ENV = "TRAINYARD_POOLER_URL"
"""pgBouncer's URL (transaction mode) for the agent's queries, as the same login as
$TRAINYARD_DATABASE_URL, which the agent still uses for LISTEN and its checks at start."""
AGENT_URL_ENV = "TRAINYARD_AGENT_DATABASE_URL"
"""Where `agent install` also takes the agent login's URL (out of `ps` and the shell history)."""
AGENT_LOGIN_HINT = (
    "as the database's owner: trainyard agent-login create NAME --node NODE --password-file FILE"
)


def machine_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    agent = commands.add_parser(
        "agent",
        help="run a node agent: register this machine's GPUs and run the jobs it claims",
        description="Register this node (its GPUs from NVML, or --fake-gpus), renew its lease by "
        "heartbeat, claim queued jobs that fit, run their learners and stream their logs, "
        "until SIGINT or SIGTERM; then stop the learners (they checkpoint), re-queue their "
        "jobs and deregister. Containers are created only from images TRAINYARD_IMAGES allows "
        "(default trainyard-learner:latest; a pinned NAME@sha256:DIGEST must be that image on "
        "the node). `trainyard agent install` sets the same up as a systemd service.",
    )
    _agent_options(agent, defaults=True)
    agent.set_defaults(handler=cmd_agent)
    # Optional, so that `trainyard agent [options]` still runs the agent itself.
    actions = agent.add_subparsers(title="commands", metavar="[install]", prog="trainyard agent")
    install = actions.add_parser(
        "install",
        help="write a systemd unit that runs this agent as a service",
        description="Write /etc/systemd/system/trainyard-agent.service, which runs `trainyard "
        "agent` with these options (Restart=always, after the network and, with --runtime "
        "docker, Docker; KillMode=process, so that stopping or losing the agent never has "
        "systemd kill its learners), and its environment file (TRAINYARD_DATABASE_URL, "
        "TRAINYARD_HOME, and the shell's OTEL_*, TRAINYARD_IMAGES, TRAINYARD_DATA_ROOTS, "
        "TRAINYARD_RESULTS_ROOTS, TRAINYARD_LEARNER_UIDS and TRAINYARD_POOLER_URL; mode "
        "0600); it says which runtime will run tenants' code, and as whom. "
        "Needs root, and the URL of an agent login (--database-url-file FILE or "
        "$TRAINYARD_AGENT_DATABASE_URL), a member of the trainyard_agent role only, which "
        "the database's owner creates with `trainyard agent-login create NAME --password-file "
        "FILE`; never the owner's URL: $TRAINYARD_DATABASE_URL is not used, and the agent "
        "refuses a login with more rights unless --allow-privileged-login. A fleet's agents "
        "share one Postgres. "
        "--dry-run prints both files (password masked) and writes nothing. systemctl is "
        "left to you.",
    )
    # The agent's options may come before or after `install`: the subparser only sets those
    # given after it (no defaults of its own), so it never overwrites ones given before.
    _agent_options(install, defaults=False)
    install.add_argument(
        "--database-url-file",
        metavar="FILE",
        help="a file holding the fleet's Postgres as an agent login, "
        "postgresql://NAME:PASSWORD@HOST:PORT/DB; - for standard input (default: "
        "$TRAINYARD_AGENT_DATABASE_URL; see `trainyard agent-login create --help`)",
    )
    install.add_argument(
        "--database-url",
        action=RefusedSecret,
        instead=f"--database-url-file FILE or ${AGENT_URL_ENV}",
        help=argparse.SUPPRESS,
    )
    install.add_argument(
        "--home",
        type=Path,
        default=DEFAULT_HOME,
        help=f"the service's TRAINYARD_HOME (default: {DEFAULT_HOME})",
    )
    install.add_argument(
        "--unit-dir",
        type=Path,
        default=DEFAULT_UNIT_DIR,
        help=f"where {UNIT_NAME} goes (default: {DEFAULT_UNIT_DIR})",
    )
    install.add_argument(
        "--env-file",
        type=Path,
        default=DEFAULT_ENV_FILE,
        help=f"the environment file (default: {DEFAULT_ENV_FILE})",
    )
    install.add_argument(
        "--dry-run", action="store_true", help="print both files instead of writing them"
    )
    install.set_defaults(handler=cmd_install)


def _agent_options(command: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options of `trainyard agent`, for the agent itself and for `agent install`."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    command.add_argument(
        "--name", default=default(socket.gethostname()), help="node name (default: host)"
    )
    command.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=default(None),
        help="how learners run: child processes (the image is not used), or Docker "
        "containers (default: docker when a Docker engine answers as the agent starts, "
        "else process; docker without an engine refuses to start)",
    )
    command.add_argument(
        "--allow-network",
        action="append",
        metavar="TENANT",
        default=default([]),
        help="let this tenant's learners use the network (repeatable): each job gets a "
        "Docker network of its own that reaches the internet, not the node, other jobs, "
        "private or link-local addresses (needs root: iptables); the others' containers "
        "have none",
    )
    command.add_argument(
        "--node-address",
        metavar="IPV4",
        default=default(None),
        help="this node's address on the cluster network, recorded with its registration: a "
        "job whose learners (sandboxed processes or containers) span nodes reaches its "
        "learners on this node through it "
        "(the nodes' addresses must be on one link; needs root: ip, iptables); without it, "
        "such a job's learners here cannot reach those on other nodes (a rendezvous across "
        "them fails within its timeout)",
    )
    command.add_argument(
        "--job-network",
        metavar="CIDR",
        default=default(DEFAULT_RANGE),
        help="the cluster's range of jobs' addresses across nodes, the same on every node: a "
        f"/{JOB_PREFIX} per running job, by its learner uid (default: {DEFAULT_RANGE}); no "
        "learner reaches it but its own job's",
    )
    command.add_argument(
        "--fake-gpus",
        type=int,
        metavar="N",
        default=default(None),
        help="offer N fake GPUs (machines without GPUs)",
    )
    # None: counted when the agent starts, so that an installed service follows the machine.
    command.add_argument(
        "--cpus", type=float, default=default(None), help="CPUs to offer (default: all)"
    )
    command.add_argument(
        "--memory-mb",
        type=int,
        default=default(None),
        help="memory to offer, in MiB (default: all)",
    )
    command.add_argument(
        "--work-dir",
        type=Path,
        default=default(None),
        help="learners' working, checkpoint and results directories "
        "(default: $TRAINYARD_HOME/agents/NAME)",
    )
    command.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=default(None),
        help="where jobs' checkpoints go; a directory every node mounts (NFS) lets a job "
        "whose node was lost resume from its checkpoint on another node (default: under "
        "the work directory, so only on this node)",
    )
    command.add_argument(
        "--heartbeat",
        type=float,
        default=default(2.0),
        help="seconds between heartbeats (default: 2)",
    )
    command.add_argument(
        "--ttl",
        type=float,
        default=default(10.0),
        help="lease time to live, in seconds (default: 10)",
    )
    command.add_argument(
        "--grace",
        type=float,
        default=default(10.0),
        help="seconds between SIGTERM and SIGKILL (default: 10)",
    )
    command.add_argument(
        "--wake",
        choices=WAKES,
        default=default("listen"),
        help="how the agent hears of claimable jobs, requests and its replicas' tasks: "
        "listen holds a LISTEN connection to the server ($TRAINYARD_DATABASE_URL, never "
        "pgBouncer's) and acts on a notification at once; poll holds none and acts every "
        "--poll seconds, so that a fleet behind pgBouncer needs no server connection per "
        "agent (default: listen; keep it on nodes that run serving replicas)",
    )
    command.add_argument(
        "--poll",
        type=float,
        metavar="SECONDS",
        default=default(1.0),
        help="seconds between the agent's rounds of claims and requests that no notification "
        "woke (default: 1); with --wake poll, the most a queued job waits for a free node",
    )
    command.add_argument(
        "--serving-listen",
        metavar="HOST:PORT",
        default=default(DEFAULT_LISTEN),
        help="where the agent's serving channel listens: the control plane sends synchronous "
        "predictions to this node's replicas there, with a token the agent makes at each start "
        "and records for its own node only (port 0: one the system picks; a host of 0.0.0.0 is "
        "advertised by this machine's name); 'off': no channel, every prediction is queued in "
        f"Postgres (default: {DEFAULT_LISTEN}, loopback, for a control plane on this machine)",
    )
    command.add_argument(
        "--warm",
        type=int,
        metavar="N",
        default=default(0),
        help="warm sandboxes to keep ready (an agent that is root, process runtime): a "
        "claimed job whose only learner has no network, GPU device or file:// location starts "
        "in one, without waiting for its sandbox, its interpreter or the --warm-import "
        "modules; each runs as a uid held for the job that takes it (default: 0, none)",
    )
    command.add_argument(
        "--warm-import",
        action="append",
        metavar="MODULE",
        default=default([]),
        help="a module a warm sandbox imports ahead, besides the launcher (repeatable; "
        "`torch` saves a learner or a replica that uses it its import)",
    )
    command.add_argument(
        "--allow-privileged-login",
        action="store_true",
        default=default(False),
        help="start even when the database login has more rights than the trainyard_agent "
        "role (the owner's, say); without it the agent refuses such a login to an external "
        "database, and warns on the embedded one. Create a login with `trainyard agent-login "
        "create`",
    )


def option_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the agent's options, if anything."""
    if args.fake_gpus is not None and args.fake_gpus < 0:
        return "--fake-gpus must be >= 0"
    if args.cpus is not None and args.cpus <= 0:
        return "--cpus must be > 0"
    if args.memory_mb is not None and args.memory_mb <= 0:
        return "--memory-mb must be > 0"
    if args.heartbeat <= 0:
        return "--heartbeat must be > 0"
    if args.ttl <= args.heartbeat:
        return "--ttl must be longer than --heartbeat"
    if args.grace < 0:
        return "--grace must be >= 0"
    if args.poll <= 0:
        return "--poll must be > 0"
    if args.warm < 0:
        return "--warm must be >= 0"
    if bad := [name for name in args.warm_import if not _module_name(name)]:
        return f"--warm-import: {bad[0]!r} is not a module name"
    try:
        if args.node_address is not None:
            parse_address(args.node_address)
        if args.job_network is not None:
            AddressPlan.parse(args.job_network)
    except ValueError as exc:
        return f"--node-address or --job-network: {exc}"
    if args.serving_listen != SERVING_OFF:
        try:
            parse_listen(args.serving_listen)
        except ValueError as exc:
            return f"--serving-listen: {exc}"
    return None


def _module_name(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


LAUNCHERS = {
    "process": (sys.executable, "-m", "runners.launch"),
    # The learner image's interpreter, which has the runners package (images/learner).
    "docker": ("python3", "-m", "runners.launch"),
}


def config_from(args: argparse.Namespace, settings: Settings, runtime: str) -> AgentConfig:
    problem = option_problem(args)
    if problem is not None:
        raise SystemExit(f"trainyard agent: error: {problem}")
    try:
        images = ImageAllowlist.from_env(os.environ)
    except ValueError as exc:
        raise SystemExit(f"trainyard agent: error: {exc}") from None
    # Absolute: learners get these paths in their environment and read them from their own
    # working directories.
    checkpoint_dir = args.checkpoint_dir.absolute() if args.checkpoint_dir else None
    try:
        roots = Roots.from_env()
        learner_uids = UidRange.from_env()
    except ValueError as exc:
        raise SystemExit(f"trainyard agent: error: {exc}") from None
    return AgentConfig(
        name=args.name,
        work_dir=(args.work_dir or settings.home / "agents" / args.name).absolute(),
        cpus=args.cpus if args.cpus is not None else float(os.cpu_count() or 1),
        memory_mb=args.memory_mb if args.memory_mb is not None else machine_memory_mb(),
        launcher=LAUNCHERS[runtime],
        heartbeat_s=args.heartbeat,
        ttl_s=args.ttl,
        grace_s=args.grace,
        poll_s=args.poll,
        listen=args.wake == "listen",
        runtime=runtime,
        # Fake GPUs are not the engine's to hand out (see AgentConfig.request_gpus).
        request_gpus=args.fake_gpus is None,
        network_tenants=frozenset(args.allow_network),
        images=images,
        checkpoint_dir=checkpoint_dir,
        roots=roots,
        learner_uids=learner_uids,
        node_address=None if args.node_address is None else parse_address(args.node_address),
        job_network=AddressPlan.parse(args.job_network),
        # The model repository's folder, as the control plane's (shared with this node).
        artifacts_dir=default_root(settings).absolute(),
        serving_listen=None if args.serving_listen == SERVING_OFF else args.serving_listen,
        warm=args.warm,
        warm_imports=tuple(args.warm_import),
    )


class NoEngine(Exception):
    """`--runtime docker`, and no Docker engine answers."""


async def choose_runtime(requested: str | None) -> tuple[str, str]:
    """The runtime asked for, or docker when an engine answers, else process; and why.
    NoEngine for docker without an engine: never a silent fall back to processes, which
    isolate tenants' code less."""
    if requested == "docker" and not await docker_answers():
        raise NoEngine(
            "--runtime docker, but no Docker engine answers (DOCKER_HOST, the docker "
            "context, /var/run/docker.sock); start Docker, or choose --runtime process "
            "knowingly: it runs tenants' code as processes on this machine"
        )
    if requested is not None:
        return requested, "--runtime"
    if await docker_answers():
        return "docker", "a Docker engine answers; --runtime process to override"
    return "process", "no Docker engine answers; learners run as child processes"


ISOLATION_SETTINGS = (DATA_ROOTS_ENV, RESULTS_ROOTS_ENV, LEARNER_UIDS_ENV)
"""The installing shell's settings that the service's agent needs too."""


def isolation_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The installing shell's roots and learner uids, checked (InstallError naming the
    setting), for the service's environment file: an agent without roots refuses every
    `file://` location."""
    chosen = {name: environ[name] for name in ISOLATION_SETTINGS if environ.get(name)}
    try:
        Roots.from_env(chosen)
        UidRange.from_env(chosen)
    except ValueError as exc:
        raise InstallError(str(exc)) from None
    return chosen


def pooler_env(environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The installing shell's pgBouncer URL, checked (InstallError), for the service's
    environment file; and the same with its password masked, to print."""
    url = environ.get(POOLER_URL_ENV)
    if not url:
        return {}, {}
    check_database_url(url)
    return {POOLER_URL_ENV: url}, {POOLER_URL_ENV: mask_password(url)}


def runs_tenants_code(runtime: str | None, *, root: bool, uids: UidRange) -> str:
    """What the agent's start line (and `agent install`) says about who runs tenants' code;
    `runtime` None: chosen as the agent starts."""
    containers = "in Docker containers (no privileges, no network unless allowed)"
    processes = "as processes on this machine"
    if runtime is None:
        where = f"{containers} if an engine answers as the agent starts, else {processes}"
    else:
        where = containers if runtime == "docker" else processes
    if not root:
        return (
            f"tenants' code runs {where} AS THE AGENT'S OWN USER (uid {os.geteuid()}): the "
            "agent is not root, so it cannot give each job a user of its own, and a job's "
            "code can read whatever this user can (its files, other jobs')"
        )
    last = uids.start + uids.count - 1
    return f"tenants' code runs {where}, each job as its own uid ({uids.start}-{last})"


def reach_problem(config: AgentConfig) -> str | None:
    """Why learners that run as users of their own (the agent being root) could not reach
    their folders, if they could not."""
    if os.geteuid() != 0:
        return None
    for directory in sorted({config.work_dir, config.checkpoint_root}):
        blocked = unreachable_for_learners(directory)
        if blocked is not None:
            return (
                f"learners, which run as users of their own, cannot reach {directory}: "
                f"{blocked} lets no other user through (mode "
                f"{blocked.stat().st_mode & 0o777:04o}); give it the execute bit for others "
                "(chmod o+x, which lists nothing), or choose another --work-dir or "
                "--checkpoint-dir"
            )
    return None


async def cmd_agent(args: argparse.Namespace, settings: Settings) -> int:
    try:
        runtime, why = await choose_runtime(args.runtime)
    except NoEngine as exc:
        print(f"trainyard agent: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    config = config_from(args, settings, runtime)
    root = os.geteuid() == 0
    # On standard output, so that the service's journal says how its learners run.
    print(f"trainyard agent {config.name}: runtime {runtime} ({why})", flush=True)
    who = runs_tenants_code(runtime, root=root, uids=config.learner_uids)
    print(f"trainyard agent {config.name}: {who}", flush=True)
    if not root:
        log.warning("%s", who)
    problem = reach_problem(config)
    if problem is not None:
        print(f"trainyard agent: error: {problem}", file=sys.stderr)
        return EXIT_FAILED
    setup_telemetry("trainyard-agent")
    url = await resolve_database(settings)
    await require_migrated(url)
    excess = await login_excess(url)
    if excess and not args.allow_privileged_login:
        problem = (
            f"the database login has more rights than the {AGENT_ROLE} role "
            f"({', '.join(excess)}): a node running tenants' code should not hold them. "
            f"Create an agent login ({AGENT_LOGIN_HINT}) and use its URL, or pass "
            "--allow-privileged-login"
        )
        if settings.database_url:
            print(f"trainyard agent: error: {problem}", file=sys.stderr)
            return EXIT_FAILED
        # The embedded database is one machine's, where the agent and its owner are one.
        print(f"trainyard agent: warning: {problem}", file=sys.stderr, flush=True)
    if not excess:
        # An agent login reaches its own node's work only (docs/agent-role.md): under another
        # node's name it could not even register.
        unbound = await binding_problem(url, config.name)
        if unbound is not None:
            print(f"trainyard agent: error: {unbound}", file=sys.stderr)
            return EXIT_FAILED
    pooled_url = os.environ.get(POOLER_URL_ENV) or None
    if pooled_url is not None and not settings.database_url:
        print(
            f"trainyard agent: error: ${POOLER_URL_ENV} is set, but $TRAINYARD_DATABASE_URL is "
            "not: pgBouncer stands in front of a fleet's Postgres, not the embedded one",
            file=sys.stderr,
        )
        return EXIT_FAILED
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # A name held by a live agent (NodeNameTaken), a work directory in use by another agent
    # (WorkDirInUse), or a login without its settings for pgBouncer (LoginUnprepared), is
    # reported by `main`, exit code 1.
    await run_agent(url, config, fake_gpus=args.fake_gpus, stop=stop, pooled_url=pooled_url)
    return 0


async def binding_problem(url: str, name: str) -> str | None:
    """Why the agent login of `url` cannot work as node `name`, if it cannot."""
    bound = await login_node(url)
    if bound == name:
        return None
    fix = (
        f"bind the login to this node (as the database's owner: trainyard agent-login bind NAME "
        f"--node {name})"
    )
    if bound is None:
        return f"the database login is bound to no node: {fix}"
    return (
        f"the database login works for node {bound!r}, not {name!r}: start the agent with "
        f"--name {bound}, or {fix}"
    )


async def cmd_install(args: argparse.Namespace, settings: Settings) -> int:
    return install(args, os.environ, running_as_root=os.geteuid() == 0)


def install(args: argparse.Namespace, environ: Mapping[str, str], *, running_as_root: bool) -> int:
    """`trainyard agent install`, with the environment and the euid check injected (tests run
    as any user)."""
    problem = option_problem(args)
    if problem is not None:
        return _install_error(problem)
    # Never $TRAINYARD_DATABASE_URL: on an operator's machine that is the owner's URL, and a
    # node running tenants' code must log in as an agent (see `agent-login create`).
    url = environ.get(AGENT_URL_ENV)
    if args.database_url_file is not None:
        try:
            url = read_secret_file(args.database_url_file, "database URL")
        except ValueError as exc:
            return _install_error(str(exc))
    if not url:
        return _install_error(
            f"no database: pass --database-url-file FILE (holding "
            f"postgresql://NAME:PASSWORD@HOST/DB) or set ${AGENT_URL_ENV}: the URL of an agent "
            f"login (create one {AGENT_LOGIN_HINT}); a fleet's agents share one Postgres, and "
            "the embedded database is only for a single machine"
        )
    options = ServiceOptions(
        python=sys.executable,
        name=args.name,
        runtime=args.runtime,
        heartbeat_s=args.heartbeat,
        ttl_s=args.ttl,
        grace_s=args.grace,
        env_file=args.env_file,
        fake_gpus=args.fake_gpus,
        cpus=args.cpus,
        memory_mb=args.memory_mb,
        work_dir=args.work_dir,
        allow_network=tuple(args.allow_network),
        checkpoint_dir=args.checkpoint_dir,
        allow_privileged_login=args.allow_privileged_login,
        wake=args.wake,
        poll_s=args.poll,
        node_address=args.node_address,
        job_network=args.job_network,
        serving_listen=args.serving_listen,
        warm=args.warm,
        warm_imports=tuple(args.warm_import),
    )
    unit_path: Path = args.unit_dir / UNIT_NAME
    try:
        check_database_url(url)
        if not args.unit_dir.is_absolute():
            raise InstallError(f"--unit-dir must be an absolute path, not {str(args.unit_dir)!r}")
        unit = render_unit(options)
        chosen = {**images_env(environ), **isolation_env(environ)}
        pooler, shown_pooler = pooler_env(environ)
        env = render_env(url, args.home, {**telemetry_env(environ), **chosen, **pooler})
        shown_env = render_env(
            mask_password(url),
            args.home,
            {**telemetry_env(environ, masked=True), **chosen, **shown_pooler},
        )
    except InstallError as exc:
        return _install_error(str(exc))
    who = runs_tenants_code(args.runtime, root=True, uids=UidRange.from_env(chosen))
    # The operator sees how tenants' code will run on this node.
    runs = f"runtime {args.runtime or 'chosen as it starts'}: {who} (the service runs as root)"
    if args.dry_run:
        print(f"# {runs}")
        print(f"# {unit_path}\n{unit}")
        print(f"# {args.env_file} (mode 0600; the password is masked here)\n{shown_env}", end="")
        return 0
    if not running_as_root:
        print(
            f"trainyard agent install: must run as root to write {unit_path} and "
            f"{args.env_file}; nothing was written (use sudo, or --dry-run to print them)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    # The environment file first: the unit refers to it.
    write_atomically(args.env_file, env, ENV_FILE_MODE)
    write_atomically(unit_path, unit, UNIT_FILE_MODE)
    print(f"wrote {unit_path}")
    print(f"wrote {args.env_file} (mode 0600)")
    print(runs)
    print("next: systemctl daemon-reload && systemctl enable --now trainyard-agent")
    return 0


def _install_error(message: str) -> int:
    print(f"trainyard agent install: error: {message}", file=sys.stderr)
    return EXIT_USAGE
