"""`trainyard up` as a new user runs it: database, control plane, local agent, demo job."""

from __future__ import annotations

import os
import subprocess
import sys

from harness.served import free_port
from tests.cluster import learner_space


def test_up_runs_the_demo_job_to_completion_and_streams_it(db_url: str) -> None:
    # A home its learners can reach when the tests run as root (they run as users of their own).
    home = learner_space()
    env = {**os.environ, "TRAINYARD_DATABASE_URL": db_url, "TRAINYARD_HOME": str(home)}
    command = ["up", "--port", str(free_port()), "--exit-after-demo"]
    result = subprocess.run(
        [sys.executable, "-m", "cli", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    admin_token = (home / "admin-token").read_text().strip()
    assert f"admin token issued, in {home / 'admin-token'} (mode 0600)" in out
    assert admin_token not in result.stdout + result.stderr  # only in its file
    assert (home / "admin-token").stat().st_mode & 0o777 == 0o600
    for state in ("QUEUED", "DEPLOYING", "PROCESSING", "COMPLETED"):
        assert f": {state}, attempt 1" in out
    assert "[learner 0] step 400: final_loss" in out  # real training, its logs streamed
    assert out.rstrip().endswith("shutting down")
    assert (home / "demo-token").stat().st_mode & 0o777 == 0o600
