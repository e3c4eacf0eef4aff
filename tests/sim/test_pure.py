"""The simulator's core is pure: it replays any store's events without a database driver (only
`sim.log` reads Postgres); a fresh interpreter, so that what other tests imported does not
count."""

from __future__ import annotations

import subprocess
import sys

CORE = ("cluster", "engine", "metrics", "policy", "queue", "recording", "report", "workload")


def test_the_simulators_core_imports_no_database_driver() -> None:
    modules = ", ".join(f"sim.{name}" for name in CORE)
    code = f"import sys, {modules}; print('asyncpg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
