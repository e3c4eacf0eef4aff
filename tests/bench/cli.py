"""A benchmark as its users run it: `trainyard bench NAME --json`, a child process, on the
tests' Postgres server (each benchmark makes its own scratch databases there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TIMEOUT_S = 240


def bench(server: str, home: Path, name: str, *options: str) -> dict[str, Any]:
    """The JSON object the benchmark printed; what it said on stderr when it failed."""
    done = subprocess.run(
        [sys.executable, "-m", "cli", "bench", name, "--json", *options],
        capture_output=True,
        text=True,
        env={**os.environ, "TRAINYARD_DATABASE_URL": server, "TRAINYARD_HOME": str(home)},
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result
