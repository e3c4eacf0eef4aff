"""`trainyard up` as a new user runs it: database, control plane, local agent, demo job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.served import free_port


def test_up_runs_the_demo_job_to_completion_and_streams_it(db_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "TRAINYARD_DATABASE_URL": db_url, "TRAINYARD_HOME": str(tmp_path)}
    command = ["up", "--port", str(free_port()), "--exit-after-demo"]
    result = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    admin_token = (tmp_path / "admin-token").read_text().strip()
    assert f"admin token issued, in {tmp_path / 'admin-token'} (mode 0600)" in out
    assert admin_token not in result.stdout + result.stderr  # only in its file
    assert (tmp_path / "admin-token").stat().st_mode & 0o777 == 0o600
    for state in ("QUEUED", "DEPLOYING", "PROCESSING", "COMPLETED"):
        assert f": {state}, attempt 1" in out
    assert "[learner 0] step 400: final_loss" in out  # real training, its logs streamed
    assert out.rstrip().endswith("shutting down")
    assert (tmp_path / "demo-token").stat().st_mode & 0o777 == 0o600
