"""The web dashboard (`controlplane/ui/static/`) in a real headless Chromium against a served
control plane and a real process-runtime agent: signing in and out, the session cookie and
CSRF, watching a job run to COMPLETED with its logs streaming (without a gap or a repeat across
reconnects, ours and the server's) and its chart drawn, cancelling, tenancy, and the other
pages. Screenshots of each page go to $TRAINYARD_SCREENSHOTS (else pytest's temporary
folder)."""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

import pytest

from tests.ui.browser import eventually, request
from tests.ui.conftest import Cluster
from tests.ui.pages import Dashboard, css

pytestmark = pytest.mark.processes

LOOP = """
import signal, sys, time
from runners import metrics
# It handles a checkpoint request (SIGUSR1) as a checkpointing script would, so the launcher
# forwards the request to it.
signal.signal(signal.SIGUSR1, lambda *_: print("checkpoint asked", flush=True))
n, pause = int(sys.argv[1]), float(sys.argv[2])
for i in range(n):
    print(f"line {i:04d}", flush=True)
    if i % 5 == 0:
        metrics.log(step=i, loss=1 / (i + 1))
    time.sleep(pause)
"""

SCORE = """
import json, os, time
from runners import metrics
hp = json.loads(os.environ["TRAINYARD_HPARAMS"])
for step in range(1, int(os.environ["TRAINYARD_BUDGET"]) + 1):
    time.sleep(0.2)
    metrics.log(step=step, score=-((hp["x"] - 3) ** 2))
"""

DASH = "\u2013"  # the en dash the jobs list writes its range with (showing 1-50 of 1234)

# A training job whose result is a servable model: one module's source.
TRAIN = """
import os, pathlib
model = "def predict(batch):\\n    return [x * 2 for x in batch]\\n"
pathlib.Path(os.environ["TRAINYARD_RESULTS_DIR"], "model.py").write_text(model)
"""


def loop(lines: int, pause: float) -> list[str]:
    """A learner's command: `lines` numbered lines, a loss every 5th, `pause` s apart."""
    return [sys.executable, "-c", LOOP, str(lines), str(pause)]


def expected(lines: int) -> list[str]:
    return [f"line {i:04d}" for i in range(lines)]


def shown_lines(dashboard: Dashboard) -> list[str]:
    """The job's own output lines the page shows, in order."""
    found: list[str] = dashboard.script(
        'return [...document.querySelectorAll("[data-test=log] .l.out .x")].map(e => e.textContent)'
    )
    return found


def shown_ids(dashboard: Dashboard) -> list[int]:
    found: list[str] = dashboard.script(
        "return [...document.querySelectorAll('[data-test=log] .l')].map(e => e.dataset.id)"
    )
    return [int(i) for i in found]


def chart_points(dashboard: Dashboard, test: str = "metrics-chart") -> int:
    found = dashboard.find_all(css(test))
    return int(found[0].get_attribute("data-points")) if found else 0


def test_sign_in_gives_an_httponly_samesite_strict_cookie_that_lasts_a_reload(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    dashboard.wait_shown("token")
    dashboard.shot("01-sign-in")
    dashboard.find(css("token")).send_keys("ty_not-a-token")
    dashboard.find(css("sign-in-submit")).click()
    dashboard.wait_text("sign-in-error", "not valid")

    dashboard.sign_in(cluster.acme)
    assert dashboard.text("who") == "acme"
    cookie = dashboard.session_cookie()
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/"
    assert 7.9 * 3600 < cookie["expiry"] - time.time() <= 8 * 3600 + 60
    # No script of the page (or one injected into it) reads the session.
    assert "trainyard_session" not in dashboard.script("return document.cookie")
    assert not dashboard.shown("nav-tenants")  # the admin's page only

    # After a reload the page asks the server who is signed in.
    dashboard.reload()
    eventually(lambda: dashboard.text("who") == "acme", "still signed in after a reload")
    dashboard.wait_shown("jobs-range")


def test_a_running_job_streams_its_logs_and_chart_to_completed_across_reconnects(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    dashboard.sign_in(cluster.acme)
    lines = 150
    job = cluster.submit(cluster.acme, loop(lines, 0.06), name="live", labels={"suite": "ui"})
    dashboard.open(f"jobs/{job}")
    dashboard.wait_text("job-name", "live")

    def running_with_chart() -> bool:
        return "PROCESSING" in dashboard.text("job-name") and chart_points(dashboard) >= 2

    eventually(running_with_chart, "the loss chart drawn while the job runs")
    dashboard.shot("03-job-running")
    # Drop the log stream twice while lines arrive: the page resumes after the last line it
    # showed (?after=), as the browser does by itself with Last-Event-ID.
    for at_least in (30, 80):
        eventually(lambda n=at_least: len(shown_lines(dashboard)) >= n, f"{at_least} lines")  # type: ignore[misc]
        dashboard.script("window.__trainyard.reconnectLogs()")
    assert len(shown_lines(dashboard)) < lines, "the job ended before the reconnects"

    dashboard.wait_text("job-name", "COMPLETED", seconds=60)
    dashboard.wait_text("log-status", "log complete")
    assert shown_lines(dashboard) == expected(lines)
    ids = shown_ids(dashboard)
    assert ids == sorted(set(ids))  # each line once, in order
    # The chart has every loss the job reported (every 5th line).
    eventually(lambda: chart_points(dashboard) == lines // 5, "every metric point drawn")
    timeline = dashboard.text("timeline")
    for event in ("submitted", "processing", "completed"):
        assert event in timeline
    assert cluster.state(cluster.acme, job) == "COMPLETED"
    assert dashboard.find(css("cancel")).get_attribute("hidden") is not None
    dashboard.shot("04-job-completed")
    dashboard.phone()
    dashboard.shot("05-job-phone")
    dashboard.laptop()


def test_a_job_of_two_learners_shows_its_ranks_and_tags_its_log_lines_by_rank(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    dashboard.sign_in(cluster.acme)
    command = [sys.executable, "-c", "import os; print('hello from rank', os.environ['RANK'])"]
    job = cluster.submit(cluster.acme, command, name="pair", learners=2, gpus_per_learner=1)
    dashboard.open(f"jobs/{job}")
    dashboard.wait_text("job-name", "COMPLETED", seconds=60)
    dashboard.wait_text("log-status", "log complete")
    # Its ranks: each on the agent's node with a GPU of its own, each exited 0.
    rows: list[list[str]] = dashboard.script(
        "return [...document.querySelectorAll('[data-test=ranks] tbody tr')]"
        ".map(r => [...r.cells].map(c => c.textContent))"
    )
    assert [row[:2] + row[3:] for row in rows] == [
        ["0", "n1", "COMPLETED", "0"],
        ["1", "n1", "COMPLETED", "0"],
    ]
    gpus = cluster.api("GET", f"/v1/jobs/{job}", cluster.acme).body["gpus"]
    assert [row[2] for row in rows] == gpus
    # Each line of its output carries its rank.
    tagged: list[list[str]] = dashboard.script(
        "return [...document.querySelectorAll('[data-test=log] .l.out')]"
        ".map(l => [l.querySelector('.rk').textContent, l.querySelector('.x').textContent])"
    )
    assert sorted(tagged) == [["r0", "hello from rank 0"], ["r1", "hello from rank 1"]]
    dashboard.shot("04b-job-ranks")


def test_logs_resume_without_gaps_or_repeats_when_the_server_drops_the_stream(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    dashboard.sign_in(cluster.acme)
    lines = 120
    job = cluster.submit(cluster.acme, loop(lines, 0.08), name="through-a-restart")
    dashboard.open(f"jobs/{job}")
    eventually(lambda: len(shown_lines(dashboard)) >= 20, "the first lines")
    # The control plane stops and starts again: the browser's EventSource reconnects by itself
    # with Last-Event-ID.
    cluster.restart()
    dashboard.wait_text("job-name", "COMPLETED", seconds=60)
    dashboard.wait_text("log-status", "log complete")
    assert shown_lines(dashboard) == expected(lines)
    ids = shown_ids(dashboard)
    assert ids == sorted(set(ids))
    dashboard.driver.get_log("browser")  # the dropped connections' errors were expected here


# Records the job's output lines drawn at the instant the log's status first reads "log
# complete": an observer runs right after the script that changed the status, before any timer
# of the page's (the log view draws what arrives a moment later, in one go).
AT_COMPLETE = """
window.__atComplete = null;
window.__watcher ??= new MutationObserver(() => {
  const status = document.querySelector("[data-test=log-status]");
  if (window.__atComplete === null && status && status.textContent === "log complete") {
    window.__atComplete = [...document.querySelectorAll("[data-test=log] .l.out .x")]
      .map((e) => e.textContent);
  }
});
window.__watcher.observe(document.body, { subtree: true, childList: true, characterData: true });
"""


def test_the_log_is_complete_only_once_every_line_of_it_is_drawn(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    dashboard.sign_in(cluster.acme)
    lines = 40
    job = cluster.submit(cluster.acme, loop(lines, 0), name="ended")
    cluster.until_state(cluster.acme, job, "COMPLETED")
    # Opened once the job has ended (its log may still settle), then again once it has: its
    # lines and its end then come at once.
    for _ in range(2):
        dashboard.open("jobs")
        dashboard.script(AT_COMPLETE)
        dashboard.open(f"jobs/{job}")
        dashboard.wait_text("log-status", "log complete")
        assert dashboard.script("return window.__atComplete") == expected(lines)
        assert shown_lines(dashboard) == expected(lines)


def test_cancel_and_checkpoint_from_the_jobs_page(dashboard: Dashboard, cluster: Cluster) -> None:
    dashboard.sign_in(cluster.acme)
    job = cluster.submit(cluster.acme, loop(1200, 0.05), name="to-cancel")
    dashboard.open(f"jobs/{job}")
    dashboard.wait_text("job-name", "PROCESSING")

    eventually(lambda: dashboard.find(css("checkpoint")).is_enabled(), "checkpoint enabled")
    dashboard.find(css("checkpoint")).click()
    dashboard.wait_text("action-result", "Checkpoint requested")
    dashboard.wait_text("checkpoint", "requested")
    # The request reached the learner: its answer is in the log the page streams.
    eventually(lambda: "checkpoint asked" in shown_lines(dashboard), "the learner's answer")

    cancel = dashboard.find(css("cancel"))
    cancel.click()  # the first click only arms it: a stray tap must not end a job
    assert "again" in cancel.text
    time.sleep(0.3)
    assert cluster.state(cluster.acme, job) == "PROCESSING"
    cancel.click()
    dashboard.wait_text("job-name", "CANCELLED")
    dashboard.wait_text("action-result", "Cancellation recorded")
    assert cluster.state(cluster.acme, job) == "CANCELLED"
    eventually(
        lambda: "cancelled from the dashboard" in dashboard.text("history"),
        "the cancellation's reason in the history",
    )
    dashboard.shot("06-job-cancelled")


def test_a_tenant_sees_only_its_own_jobs_and_the_admin_sees_every_tenants(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    # Theirs runs on a GPU, so that the admin sees which job holds it.
    theirs = cluster.submit(
        cluster.globex, loop(1200, 0.05), name="globex-secret", gpus_per_learner=1
    )
    mine = cluster.submit(cluster.acme, loop(1, 0), name="acme-own")
    dashboard.sign_in(cluster.acme)
    dashboard.open(f"jobs/{theirs}")
    dashboard.wait_text("job-error", "404")
    assert "no such job" in dashboard.text("job-error")

    def listed() -> set[str]:
        return {r.get_attribute("data-job") for r in dashboard.find_all("[data-job]")}

    dashboard.open("jobs?limit=200")
    eventually(lambda: mine in listed(), "the tenant's own job listed")
    assert theirs not in listed()
    assert "globex-secret" not in dashboard.driver.page_source
    dashboard.open("tenants")
    dashboard.wait_shown("not-found")

    dashboard.find(css("sign-out")).click()
    dashboard.sign_in(cluster.admin)
    assert dashboard.text("who") == "admin"
    dashboard.wait_shown("nav-tenants")
    dashboard.open("jobs?limit=200")
    eventually(lambda: {mine, theirs} <= listed(), "both tenants' jobs listed for the admin")
    assert "globex" in dashboard.text("jobs-table")  # the admin's list names each job's tenant
    cluster.until_state(cluster.globex, theirs, "PROCESSING")
    dashboard.open("tenants")
    eventually(lambda: "globex" in dashboard.text("tenants-table"), "the tenants")
    assert "acme" in dashboard.text("tenants-table")
    eventually(lambda: "1 (no quota)" in dashboard.find("[data-tenant=globex]").text, "its GPU")
    dashboard.shot("09-tenants-admin")
    dashboard.open("nodes")
    eventually(
        lambda: theirs[:8] in dashboard.find("[data-status=allocated]").text,
        "the GPU that holds their job, with the job",
    )
    assert len(dashboard.find_all(css("gpu"))) == 2
    dashboard.shot("08-nodes-admin")
    assert cluster.api("POST", f"/v1/jobs/{theirs}/cancel", cluster.globex, {}).status == 200


def test_a_request_without_the_csrf_token_is_refused(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    dashboard.sign_in(cluster.acme)
    job = cluster.submit(cluster.acme, loop(1200, 0.05), name="csrf-target")
    json_type = {"Content-Type": "application/json"}
    # The page's own fetch, with its cookie, but without the header: refused.
    assert dashboard.fetch(f"/v1/jobs/{job}/cancel", "POST", json_type) == 403
    # The cookie copied into another client, without the header: refused as well.
    cookie = {"Cookie": f"trainyard_session={dashboard.session_cookie()['value']}"}
    refused = request(f"{cluster.url}/v1/jobs/{job}/cancel", "POST", body={}, headers=cookie)
    assert refused.status == 403, refused.body
    assert refused.body["field"] == "X-CSRF-Token"
    assert cluster.state(cluster.acme, job) != "CANCELLED"
    # With the session's CSRF token the same request passes.
    csrf = request(f"{cluster.url}/ui/session", headers=cookie).body["csrf"]
    passed = request(
        f"{cluster.url}/v1/jobs/{job}/cancel",
        "POST",
        body={},
        headers={**cookie, "X-CSRF-Token": csrf},
    )
    assert passed.status == 200, passed.body
    cluster.until_state(cluster.acme, job, "CANCELLED")


def test_sign_out_ends_the_session(dashboard: Dashboard, cluster: Cluster) -> None:
    dashboard.sign_in(cluster.acme)
    cookie = {"Cookie": f"trainyard_session={dashboard.session_cookie()['value']}"}
    assert request(f"{cluster.url}/v1/jobs", headers=cookie).status == 200
    dashboard.find(css("sign-out")).click()
    dashboard.wait_shown("token")
    dashboard.wait_text("sign-in-error", "Signed out")
    # Ended on the server: the cookie, wherever copied, no longer works.
    assert request(f"{cluster.url}/v1/jobs", headers=cookie).status == 401
    assert "trainyard_session" not in {c["name"] for c in dashboard.driver.get_cookies()}
    dashboard.reload()
    dashboard.wait_shown("token")


def test_the_jobs_list_filters_pages_and_shows_its_total(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    batch = uuid.uuid4().hex[:8]
    submitted = {
        cluster.submit(cluster.acme, loop(1, 0), name=f"batch-{n}", labels={"batch": batch})
        for n in range(5)
    }
    dashboard.sign_in(cluster.acme)
    dashboard.open(f"jobs?label=batch%3D{batch}&limit=2")
    seen: list[str] = []

    def page(shown: str) -> None:
        dashboard.wait_text("jobs-range", shown)
        rows = dashboard.find_all("[data-job]")
        seen.extend(r.get_attribute("data-job") for r in rows)

    page(f"showing 1{DASH}2 of 5")
    dashboard.find(css("jobs-next")).click()
    page(f"showing 3{DASH}4 of 5")
    dashboard.find(css("jobs-next")).click()
    page(f"showing 5{DASH}5 of 5")
    assert not dashboard.find(css("jobs-next")).is_enabled()
    assert sorted(seen) == sorted(submitted)  # every job once, none cut
    dashboard.find(css("jobs-prev")).click()
    dashboard.wait_text("jobs-range", f"showing 3{DASH}4 of 5")
    dashboard.find(css("jobs-prev")).click()
    dashboard.wait_text("jobs-range", f"showing 1{DASH}2 of 5")
    assert not dashboard.find(css("jobs-prev")).is_enabled()

    dashboard.open("jobs?label=batch%3Dnone-such")
    dashboard.wait_text("empty", "No jobs match")
    dashboard.open("jobs?label=nonsense")
    dashboard.wait_text("error", "KEY=VALUE")  # the API's own words
    dashboard.open("jobs")
    dashboard.wait_text("jobs-range", f"showing 1{DASH}")
    dashboard.shot("02-jobs")
    dashboard.phone()
    dashboard.shot("07-jobs-phone")
    dashboard.laptop()


def search_spec() -> dict[str, Any]:
    return {
        "name": "score",
        "trial": {"name": "t", "image": "img", "command": [sys.executable, "-c", SCORE]},
        "space": {"params": {"x": {"type": "uniform", "low": 0, "high": 6}}},
        "searcher": {"name": "random", "seed": 1},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"unit": "steps", "max": 3},
        "max_trials": 3,
        "max_concurrent_trials": 3,
    }


def model_metadata() -> dict[str, Any]:
    return {
        "title": "Doubler",
        "description": "Doubles numbers.\n<b>not bold</b>",  # shown as text, never as markup
        "creators": [{"name": "Ada"}],
        "license": "MIT",
        "domains": ["math"],
        "tags": ["demo"],
        "framework": "other",
        "servable": {
            "entry_point": "model:predict",
            "input": {"type": "list"},
            "output": {"type": "list"},
        },
        "metrics": {"accuracy": 0.93},
    }


def test_models_deployments_and_searches(dashboard: Dashboard, cluster: Cluster) -> None:
    started = cluster.api("POST", "/v1/searches", cluster.acme, search_spec())
    assert started.status == 201, started.body
    search = started.body["id"]
    results = {"location": cluster.results()}
    trainer = cluster.submit(cluster.acme, [sys.executable, "-c", TRAIN], results=results)
    cluster.until_state(cluster.acme, trainer, "COMPLETED")
    published = cluster.api(
        "POST",
        "/v1/models/doubler/versions",
        cluster.acme,
        {"from_job": trainer, "results_file": "model.py", "metadata": model_metadata()},
    )
    assert published.status == 201, published.body
    deployed = cluster.api(
        "POST", "/v1/deployments", cluster.acme, {"name": "dbl", "model": "doubler"}
    )
    assert deployed.status == 201, deployed.body

    # The search reads a projection: a version shows once it has caught up.
    eventually(
        lambda: cluster.api("GET", "/v1/models?q=doubler", cluster.acme).body["total"] == 1,
        "the version searchable",
    )
    dashboard.sign_in(cluster.acme)
    dashboard.open("models?q=doubler")
    eventually(lambda: dashboard.find_all("[data-model='acme/doubler:1']"), "the model found")
    dashboard.shot("10-models")
    dashboard.find("[data-model='acme/doubler:1'] a").click()
    dashboard.wait_text("provenance", trainer[:8])
    assert "<b>not bold</b>" in dashboard.text("model")
    dashboard.shot("11-model")
    dashboard.find(f"{css('provenance')} a").click()
    dashboard.wait_text("job-id", trainer)

    dashboard.open("deployments/dbl")
    eventually(lambda: "PROCESSING" in dashboard.find("section.page").text, "a replica serving")
    for value in (1, 2):
        answer = cluster.api(
            "POST", "/v1/deployments/dbl/predict", cluster.acme, {"inputs": [value]}
        )
        assert answer.status == 200, answer.body
        assert answer.body["outputs"] == [value * 2]
    dashboard.wait_text("stat-requests", "2", seconds=15)
    dashboard.shot("12-deployment")

    dashboard.open(f"searches/{search}")
    eventually(
        lambda: chart_points(dashboard, "trials-chart") >= 3 and dashboard.shown("best"),
        "every trial on the chart and the best so far",
        seconds=60,
    )
    eventually(lambda: "COMPLETED" in dashboard.find("h1").text, "the search completed")
    assert len(dashboard.find_all("[data-trial]")) == 3
    dashboard.shot("13-search")
    dashboard.open("searches")
    dashboard.wait_shown("searches-table")
    dashboard.shot("14-searches")
