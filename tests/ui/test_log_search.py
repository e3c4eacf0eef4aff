"""The dashboard's log search (`controlplane/ui/static/logsearch.js`) in the real headless
Chromium: a tenant's matching lines of all its jobs, newest first, never another tenant's; a
regular expression the server refuses shows its reason; following adds a new job's matching
lines as they are printed. Screenshot: 30-log-search.png."""

from __future__ import annotations

import sys
import uuid

import pytest

from tests.ui.browser import eventually
from tests.ui.conftest import Cluster
from tests.ui.pages import Dashboard, css

pytestmark = pytest.mark.processes

PRINT = "import sys\nfor text in sys.argv[1:]:\n    print(text, flush=True)\n"


def printing(*texts: str) -> list[str]:
    return [sys.executable, "-c", PRINT, *texts]


def shown_lines(dashboard: Dashboard, table: str = "logsearch-table") -> list[str]:
    return [row.text for row in dashboard.find_all(f"{css(table)} [data-test='logsearch-line']")]


def test_a_tenant_searches_its_jobs_logs_and_follows_new_matches(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    tag = uuid.uuid4().hex[:8]
    done = ("COMPLETED", "FAILED")
    # One after the other, so that the second job's line is the newer.
    first = cluster.submit(cluster.acme, printing(f"{tag} loading", f"{tag} CUDA out of memory"))
    cluster.until_state(cluster.acme, first, *done)
    second = cluster.submit(cluster.acme, printing(f"{tag} epoch 1: out of memory"))
    theirs = cluster.submit(cluster.globex, printing(f"{tag} globex out of memory"))
    cluster.until_state(cluster.acme, second, *done)
    cluster.until_state(cluster.globex, theirs, *done)

    dashboard.sign_in(cluster.acme)
    dashboard.open("logs")
    dashboard.wait_shown("logsearch-form")
    dashboard.find(css("logsearch-pattern")).send_keys(f"{tag} .*out of memory")
    dashboard.find(css("logsearch-regex")).click()
    dashboard.find(css("logsearch-submit")).click()
    eventually(lambda: len(shown_lines(dashboard)) == 2, "two matching lines")
    lines = shown_lines(dashboard)
    # Newest first (the second job's line was printed later), each with its job and place.
    assert "epoch 1: out of memory" in lines[0] and "CUDA out of memory" in lines[1]
    assert second[:8] in lines[0] and first[:8] in lines[1]
    assert "attempt 1 · learner 0 · stdout" in lines[0]
    assert not any("globex" in line for line in lines)

    # Following: a new job's matching line appears without a reload.
    dashboard.find(css("logsearch-follow")).click()
    later = cluster.submit(cluster.acme, printing(f"{tag} later: out of memory", "unrelated"))
    eventually(
        lambda: any("later" in x for x in shown_lines(dashboard, "logsearch-followed")),
        "the followed line",
        60,
    )
    assert later[:8] in shown_lines(dashboard, "logsearch-followed")[0]
    dashboard.shot("30-log-search")

    # A regular expression Postgres refuses: the server's reason, not a broken page.
    dashboard.open(f"logs?pattern=%28{tag}&regex=true")
    dashboard.wait_text("logsearch-error", "400")
    assert "regular expression" in dashboard.text("logsearch-error")
