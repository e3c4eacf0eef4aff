"""Trials compared at a glance, in the real browser: a search's page draws every trial's
metric curve on one chart (coloured by the rung each reached, the best drawn over the rest),
its hyperparameters against the objective in parallel coordinates (a log-uniform one on a log
axis, a choice on a categorical one) and each trial's rung; trials picked there are overlaid
on a compare page of their own. Screenshots of each page go where the other dashboard tests'
go."""

from __future__ import annotations

import sys
from typing import Any

from bench.ui import write_search
from controlplane.database import create_pool
from tests.ui.browser import eventually
from tests.ui.conftest import Cluster
from tests.ui.pages import Dashboard, css

# A trial's learner: its loss falls with the steps towards a floor its hyperparameter sets.
LEARNER = """
import json, os
from runners import metrics
hp = json.loads(os.environ["TRAINYARD_HPARAMS"])
for step in range(1, int(os.environ["TRAINYARD_BUDGET"]) + 1):
    metrics.log(step=step, loss=(hp["x"] - 3) ** 2 + 5 / step)
"""


def written_search(cluster: Cluster, trials: int) -> str:
    """An ASHA search of `trials` trials with three rungs, finished, as its driver and
    learners leave one (written to the database as bench ui writes its own)."""

    async def write() -> str:
        pool = await create_pool(cluster.served.database_url, min_size=1, max_size=2)
        try:
            return str(await write_search(pool, "acme", trials, budget=90))
        finally:
            await pool.close()

    return cluster.bg.run(write())


def completed(cluster: Cluster, search: str) -> None:
    """Once the read model has caught up with the whole search (its projection applies the
    search's events in batches)."""

    def state() -> str | None:
        answer = cluster.api("GET", f"/v1/searches/{search}", cluster.acme)
        return str(answer.body["state"]) if answer.status == 200 else None

    eventually(lambda: state() == "completed", "the search completed in the read model", 60)


def count(dashboard: Dashboard, selector: str) -> int:
    return len(dashboard.find_all(selector))


def attribute(dashboard: Dashboard, test: str, name: str) -> int:
    found = dashboard.find_all(css(test))
    return int(found[0].get_attribute(name)) if found else 0


def test_a_search_page_draws_every_curve_the_hyperparameters_and_the_rungs(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    search = written_search(cluster, 30)
    completed(cluster, search)
    dashboard.sign_in(cluster.acme)
    dashboard.open(f"searches/{search}")
    eventually(lambda: attribute(dashboard, "curves-chart", "data-curves") == 30, "30 curves")
    eventually(lambda: attribute(dashboard, "parallel-chart", "data-lines") == 30, "30 lines")
    # The rungs: a badge per trial in the table, a colour per rung on the chart, and the rungs'
    # budgets marked on its step axis (rung 0 ends at step 10, rung 1 at step 30).
    rungs = [e.get_attribute("data-rung") for e in dashboard.find_all("[data-trial] [data-rung]")]
    assert sorted(rungs) == sorted(["2"] * 4 + ["1"] * 6 + ["0"] * 20)
    assert [m.text for m in dashboard.find_all(f"{css('curves-chart')} .mark text")] == [
        "rung 0",
        "rung 1",
    ]
    assert count(dashboard, f"{css('curves-chart')} .trace.c2") == 4
    # The best trial, drawn over the rest on both charts and named in the summary.
    best = dashboard.find(f"{css('best')} dd").text
    assert dashboard.find(f"{css('curves-chart')} .trace.best").get_attribute("data-series") == str(
        best
    )
    assert count(dashboard, f"{css('parallel-chart')} .pc-line.best") == 1
    # The space's scales: lr log-uniform, dropout uniform, layers whole, optimizer a choice,
    # and the objective last.
    kinds = {
        a.get_attribute("data-axis"): a.get_attribute("data-kind")
        for a in dashboard.find_all(f"{css('parallel-chart')} .pc-axis")
    }
    assert kinds == {
        "lr": "log",
        "dropout": "linear",
        "layers": "int",
        "optimizer": "category",
        "loss": "linear",
    }
    assert "sgd" in dashboard.text("parallel-chart")
    # Hovering a curve names its trial; clicking picks it.
    end = dashboard.find(f"{css('curves-chart')} .trace.best circle")
    ActionChains(dashboard.driver).move_to_element(end).perform()
    dashboard.wait_text("curves-chart-readout", f"trial {best}, rung 2")
    ActionChains(dashboard.driver).click(end).perform()
    dashboard.wait_text("picked", "1 trial picked")
    assert count(dashboard, f"{css('parallel-chart')} .pc-line.picked") == 1
    dashboard.shot("20-search-trials")


def test_a_search_of_a_thousand_trials_is_drawn_whole(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    search = written_search(cluster, 1000)
    completed(cluster, search)
    dashboard.sign_in(cluster.acme)
    dashboard.open(f"searches/{search}")
    eventually(
        lambda: attribute(dashboard, "curves-chart", "data-curves") == 1000, "1,000 curves", 60
    )
    eventually(lambda: attribute(dashboard, "parallel-chart", "data-lines") == 1000, "lines")
    assert count(dashboard, "[data-trial] [data-rung]") == 1000
    # As the page measures it for `trainyard bench ui`, once everything was drawn.
    rendered = eventually(
        lambda: dashboard.script("return window.__trainyard.searchRendered?.()"), "rendered"
    )
    assert rendered["trials"] == rendered["curves"] == 1000
    dashboard.shot("21-search-1000-trials")


def test_trials_picked_on_a_search_page_are_overlaid_on_the_compare_page(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    document: dict[str, Any] = {
        "name": "overlay",
        "trial": {"name": "t", "image": "img", "command": [sys.executable, "-c", LEARNER]},
        "space": {"params": {"x": {"type": "uniform", "low": 0, "high": 6}}},
        "searcher": {"name": "random", "seed": 2},
        "metric": {"name": "loss", "mode": "min"},
        "budget": {"unit": "steps", "max": 20},
        "max_trials": 3,
        "max_concurrent_trials": 3,
    }
    started = cluster.api("POST", "/v1/searches", cluster.acme, document)
    assert started.status == 201, started.body
    search = started.body["id"]
    completed(cluster, search)
    dashboard.sign_in(cluster.acme)
    dashboard.open(f"searches/{search}")
    eventually(lambda: attribute(dashboard, "curves-chart", "data-curves") == 3, "3 curves")
    assert attribute(dashboard, "curves-chart", "data-points") == 60
    for number in (0, 2):
        dashboard.find(f"[data-pick='{number}']").click()
    dashboard.wait_text("picked", "2 trials picked: 0, 2")
    dashboard.find(css("compare")).click()
    eventually(lambda: "#/compare?" in dashboard.driver.current_url, "the compare page")
    chart = f"{css('compare-chart')} [data-series]"
    eventually(lambda: count(dashboard, chart) == 2, "two curves overlaid")
    assert attribute(dashboard, "compare-chart", "data-points") == 40
    names = [e.get_attribute("data-series") for e in dashboard.find_all(chart)]
    assert [n.split(" · ")[0] for n in names] == ["overlay-trial-0", "overlay-trial-2"]
    assert count(dashboard, f"{css('compare-table')} tbody tr") == 2
    dashboard.shot("22-compare")
    # A third job, added by its id: three curves; one removed: two again.
    trials = cluster.api("GET", f"/v1/searches/{search}/trials", cluster.acme).body["trials"]
    dashboard.find(css("compare-add")).send_keys(trials[1]["job_id"])
    dashboard.find(f"{css('compare-add')} + button").click()
    eventually(lambda: count(dashboard, chart) == 3, "three curves overlaid")
    dashboard.find_all(css("compare-remove"))[0].click()
    eventually(lambda: count(dashboard, chart) == 2, "two curves again")
    names = [e.get_attribute("data-series") for e in dashboard.find_all(chart)]
    assert [n.split(" · ")[0] for n in names] == ["overlay-trial-2", "overlay-trial-1"]
