"""Jobs picked on the jobs list and compared, in the real browser: a box per job, picks that
survive paging, filtering and Back, a Compare action only with two or more picked, and the
compare page with one curve per picked job (any jobs of the tenant, not only a search's
trials), a job that reported no metrics named there instead of drawn, and a compare link that
another tenant cannot read. Screenshots go where the other dashboard tests' go."""

from __future__ import annotations

import sys
import time
import uuid

from bench.ui import TENANT as BENCH_TENANT
from bench.ui import _fill
from tests.ui.browser import eventually
from tests.ui.conftest import Cluster
from tests.ui.pages import Dashboard, css

# A job's learner: a loss falling as `rate / step`, one report per step.
CURVE = """
import sys
from runners import metrics
rate = float(sys.argv[1])
for step in range(1, 21):
    metrics.log(step=step, loss=rate / step)
"""

SERIES = f"{css('compare-chart')} [data-series]"
DASH = "\u2013"  # the en dash the jobs list writes its range with


def box(job: str) -> str:
    return f"[data-pick-job='{job}']"


def to_the_page_with(dashboard: Dashboard, listing: str, job: str) -> int:
    """Open the list from its first page and page forward until `job` is on it; its number."""
    dashboard.open(listing)
    for page in range(1, 3):
        dashboard.wait_text("jobs-range", "of 3")
        if dashboard.find_all(box(job)):
            return page
        click(dashboard, css("jobs-next"))
        dashboard.wait_text("jobs-range", f"showing {2 * page + 1}")
    raise AssertionError(f"job {job} on none of the list's pages")


def click(dashboard: Dashboard, selector: str) -> None:
    """Click what `selector` finds, found again if the page redrew it in between (a click on
    an element no longer shown never happened, so it is made again)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(5):
        try:
            dashboard.find(selector).click()
            return
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{selector} redrawn under every click")


def picked(dashboard: Dashboard) -> list[str]:
    """The jobs the list's bar names as picked, in the order picked."""
    return [e.get_attribute("data-picked") for e in dashboard.find_all("[data-picked]")]


def ticked(dashboard: Dashboard) -> list[str]:
    """The jobs whose boxes on the shown page are ticked and their rows marked, read at once
    (the list is drawn again every 5 s)."""
    found: list[str] = dashboard.script(
        "return [...document.querySelectorAll('[data-pick-job]:checked')]"
        ".filter(b => b.closest('tr').classList.contains('picked')).map(b => b.dataset.pickJob)"
    )
    return found


def series(dashboard: Dashboard) -> list[str]:
    return [e.get_attribute("data-series").split(" · ")[0] for e in dashboard.find_all(SERIES)]


def test_jobs_picked_on_the_list_are_overlaid_on_the_compare_page(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    from selenium.webdriver.support.select import Select

    batch = uuid.uuid4().hex[:8]
    labels = {"cmp": batch}
    # Submitted in this order, newest first on the list: two per page puts b and the quiet
    # job on the first page, a on the second.
    a = cluster.submit(
        cluster.acme, [sys.executable, "-c", CURVE, "4"], name="cmp-a", labels=labels
    )
    quiet = cluster.submit(
        cluster.acme, [sys.executable, "-c", "print('no metrics')"], name="cmp-quiet", labels=labels
    )
    b = cluster.submit(
        cluster.acme, [sys.executable, "-c", CURVE, "2"], name="cmp-b", labels=labels
    )
    for job in (a, quiet, b):
        cluster.until_state(cluster.acme, job, "COMPLETED")
    dashboard.sign_in(cluster.acme)
    listing = f"jobs?label=cmp%3D{batch}&limit=2"

    # Nothing picked, then one: no comparison yet.
    page_of_a = to_the_page_with(dashboard, listing, a)
    assert not dashboard.find(css("jobs-compare")).is_enabled()
    assert "Pick two or more jobs" in dashboard.text("jobs-picked")
    click(dashboard, box(a))
    dashboard.wait_text("jobs-picked", "1 job picked")
    assert picked(dashboard) == [a]
    assert not dashboard.find(css("jobs-compare")).is_enabled()

    # The second on another page: the first is still picked there, and named in the bar.
    page_of_b = to_the_page_with(dashboard, listing, b)
    assert page_of_a != page_of_b
    assert picked(dashboard) == [a]
    click(dashboard, box(b))
    dashboard.wait_text("jobs-picked", "2 jobs picked")
    assert picked(dashboard) == [a, b]
    assert dashboard.find(css("jobs-compare")).is_enabled()

    # Filtered (completed jobs only): both still picked, their boxes ticked where shown.
    Select(dashboard.find(css("filter-state"))).select_by_value("COMPLETED")
    eventually(lambda: "state=COMPLETED" in dashboard.driver.current_url, "the filter applied")
    dashboard.wait_text("jobs-range", "of 3")
    assert picked(dashboard) == [a, b]
    assert ticked(dashboard) == [b]
    dashboard.shot("23-jobs-picked")

    # Compared: one curve per picked job, in the order picked, with a key each.
    dashboard.find(css("jobs-compare")).click()
    eventually(lambda: "#/compare?" in dashboard.driver.current_url, "the compare page")
    assert f"jobs={a}%2C{b}" in dashboard.driver.current_url
    eventually(lambda: len(dashboard.find_all(SERIES)) == 2, "two curves overlaid")
    assert series(dashboard) == ["cmp-a", "cmp-b"]
    keys = [k.text for k in dashboard.find_all(f"{css('compare-box')} .legend .key")]
    assert [k.split(" · ")[0] for k in keys] == ["cmp-a", "cmp-b"]
    assert int(dashboard.find(css("compare-chart")).get_attribute("data-points")) == 40
    assert not dashboard.find_all(css("compare-no-metrics"))
    dashboard.shot("23-jobs-pick-compare")
    # The address is the comparison: loaded afresh, it draws the same.
    shared = dashboard.driver.current_url
    dashboard.reload()
    eventually(lambda: series(dashboard) == ["cmp-a", "cmp-b"], "the same curves after a reload")

    # Back on the list the picks are there; the quiet job added, it is named, not drawn.
    dashboard.driver.back()
    dashboard.wait_text("jobs-range", "of 3")
    eventually(lambda: picked(dashboard) == [a, b], "the picks after Back")
    click(dashboard, box(quiet))
    dashboard.wait_text("jobs-picked", "3 jobs picked")
    dashboard.find(css("jobs-compare")).click()
    eventually(lambda: len(dashboard.find_all(f"{css('compare-table')} tbody tr")) == 3, "3 rows")
    dashboard.wait_text("compare-no-metrics", "cmp-quiet")
    assert "reported no metrics" in dashboard.text("compare-no-metrics")
    assert series(dashboard) == ["cmp-a", "cmp-b"]
    row = dashboard.find(f"tr[data-compare='{quiet}']")
    assert "reported no metrics" in row.text
    dashboard.shot("24-jobs-compare-without-metrics")

    # Unpicked by its name in the bar, then all cleared: no comparison.
    dashboard.driver.back()
    dashboard.wait_text("jobs-range", "of 3")
    eventually(lambda: picked(dashboard) == [a, b, quiet], "three picked")
    dashboard.find(f"[data-unpick='{quiet}']").click()
    eventually(lambda: picked(dashboard) == [a, b], "the quiet job unpicked")
    dashboard.find(css("jobs-clear-picked")).click()
    eventually(lambda: not picked(dashboard), "none picked")
    assert not dashboard.find(css("jobs-compare")).is_enabled()
    assert not ticked(dashboard)

    # Another tenant given the link sees neither job's name nor curve.
    dashboard.find(css("sign-out")).click()
    dashboard.sign_in(cluster.globex)
    dashboard.driver.get(shared)
    eventually(lambda: len(dashboard.find_all(css("compare-error"))) == 2, "two refusals")
    assert "404" in dashboard.text("compare-error")
    assert not dashboard.find_all(SERIES)
    assert "cmp-a" not in dashboard.driver.page_source


def test_a_page_of_500_jobs_has_a_box_each_and_at_most_16_are_picked(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    # 500 jobs of the tenant bench ui writes its history for, written as it writes them (the
    # jobs' own lifecycle events through the store): the list's largest page.
    made = cluster.api("POST", "/v1/tenants", cluster.admin, {"name": BENCH_TENANT})
    assert made.status == 201, made.body
    token = made.body["token"]
    ids = {str(job) for job in cluster.bg.run(_fill(cluster.served.database_url, 500))}
    eventually(
        lambda: cluster.api("GET", "/v1/jobs?limit=1", token).body["total"] == 500,
        "the 500 jobs in the read model",
        60,
    )
    dashboard.sign_in(token)
    started = time.monotonic()
    dashboard.open("jobs?limit=500")
    dashboard.wait_text("jobs-range", f"showing 1{DASH}500 of 500")
    drawn_s = time.monotonic() - started
    shown: list[str] = dashboard.script(
        "return [...document.querySelectorAll('[data-pick-job]')].map(b => b.dataset.pickJob)"
    )
    assert sorted(shown) == sorted(ids)
    for job in shown[:16]:
        click(dashboard, box(job))  # found afresh: the list is drawn again every 5 s
    dashboard.wait_text("jobs-picked", "16 jobs picked (at most 16)")
    # The 17th is refused: every box not picked is disabled until one is unpicked.
    assert not dashboard.find(box(shown[16])).is_enabled()
    # Counted in one script: the list is drawn again every 5 s, and elements found one by one
    # across a redraw are stale.
    enabled = dashboard.script(
        f'return [...document.querySelectorAll("{css("pick-job")}")].filter(b => !b.disabled)'
        ".length"
    )
    assert enabled == 16
    dashboard.find(css("jobs-compare")).click()
    eventually(lambda: "#/compare?" in dashboard.driver.current_url, "the compare page")
    eventually(lambda: len(dashboard.find_all(f"{css('compare-table')} tbody tr")) == 16, "16")
    # bench ui's jobs have no logs, so no metrics: said, not drawn.
    dashboard.wait_text("compare-empty", "These jobs have reported no metrics.")
    print(f"a page of 500 jobs drawn {drawn_s:.2f} s after it was opened")
