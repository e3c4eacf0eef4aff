"""The user's side stands alone: `trainyard` (SDK and user commands) imports and runs without
the server's dependencies, and the command line loads the server's and the agent's code only for
the commands that run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli.main import parser

# Each test imports the package in a fresh interpreter.
pytestmark = pytest.mark.processes

SERVER_ONLY = ("asyncpg", "pgserver", "aiodocker", "pynvml")

BLOCK = textwrap.dedent(
    f"""
    import sys
    # None in sys.modules makes every import of the name fail, as if it were not installed.
    for name in {SERVER_ONLY!r}:
        sys.modules[name] = None
    """
)


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


def test_the_sdk_imports_without_the_server_s_dependencies() -> None:
    result = _python(
        """
        import asyncio
        import trainyard
        import trainyard.commands, trainyard.config, trainyard.models_commands, trainyard.render
        from controlplane.jobs.manifest import JobSubmission
        from trainyard import AsyncClient, Client, read_manifest

        try:
            import asyncpg
        except ImportError:
            print("asyncpg blocked")
        loaded = sorted(
            name for name in sys.modules if name.split(".")[0] in ("node_agent", "bench")
        )
        print("loaded", loaded)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["asyncpg blocked", "loaded []"]


def test_user_commands_run_without_the_server_s_dependencies(tmp_path: Path) -> None:
    result = _python(
        """
        from cli.main import main

        sys.exit(main(["list", "--server", "http://127.0.0.1:9"]))
        """,
        TRAINYARD_HOME=str(tmp_path),
        TRAINYARD_TOKEN="t",
    )
    # As far as the (absent) server: the exit code and line of an unreachable one.
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("trainyard: cannot reach the server at http://127.0.0.1:9")


def test_user_commands_load_no_server_benchmark_or_agent_code() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        from cli.main import parser

        parser(running=["submit", "job.yaml"]).parse_args(["submit", "job.yaml"])
        print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert loaded.isdisjoint({"bench", "node_agent", "sim", *SERVER_ONLY, "opentelemetry"})


def test_the_lazy_command_line_lists_every_command_as_the_full_one_does() -> None:
    full = parser()
    assert parser(running=["submit"]).format_help() == full.format_help()
    assert parser(running=["agent"]).format_help() == full.format_help()
    agent = parser(running=["agent", "--name", "a"]).parse_args(["agent", "--name", "a"])
    assert agent.name == "a"
