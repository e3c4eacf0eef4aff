"""Sign-in through an identity provider in the real browser (headless Chromium): the
dashboard's "Sign in with <provider>" button, the provider's own login and consent pages (the npm
`oidc-provider`, tests/oidc), and back in the dashboard as the tenant (or the admin) the
person's groups map to; a person in no mapped group sees why; `trainyard login --sso` approved in
the browser. Screenshots of each page go to $TRAINYARD_SCREENSHOTS (oidc-*.png)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.served import ServedControlPlane
from tests.conftest import fresh_database
from tests.oidc.running import Provider, require_provider
from tests.ui.browser import Background, eventually, request
from tests.ui.conftest import Cluster
from tests.ui.pages import Dashboard, css

ACCOUNTS = {
    "alice": {"groups": ["ml-acme"]},
    "root": {"groups": ["trainyard-admins"]},
    "mallory": {"groups": ["interns"]},
}
MAPPING = {
    "TRAINYARD_OIDC_TENANT_GROUPS": "ml-acme=acme,ml-globex=globex",
    "TRAINYARD_OIDC_ADMIN_GROUPS": "trainyard-admins",
}
PROVIDER_PAGE_NOISE = "fonts.googleapis.com"
"""The provider's development pages import a web font, which this offline machine cannot load."""


@pytest.fixture(scope="module")
def cluster(
    browser_present: None,
    pg_server: str,
    template_db: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    """A control plane served with the provider configured (no agent: nothing runs here)."""
    require_provider()
    bg = Background()
    stack = contextlib.AsyncExitStack()
    try:
        url = bg.run(stack.enter_async_context(fresh_database(pg_server, template_db)))
        home = tmp_path_factory.mktemp("sign-in")
        served = ServedControlPlane(url, home / "server")
        provider = Provider([f"{served.url}/ui/login/callback"], ACCOUNTS)
        bg.run(provider.start())
        stack.push_async_callback(provider.stop)
        served.env.update(provider.settings(home / "client-secret", **MAPPING))
        bg.run(served.start())
        stack.push_async_callback(served.stop)
        admin = served.admin_token
        tokens = {}
        for name in ("acme", "globex"):
            made = request(f"{served.url}/v1/tenants", "POST", token=admin, body={"name": name})
            assert made.status == 201, made.body
            tokens[name] = made.body["token"]
        yield Cluster(served.url, admin, tokens["acme"], tokens["globex"], bg, served, home)
    finally:
        bg.run(stack.aclose(), timeout=60)
        bg.close()


def at_provider(dashboard: Dashboard, login: str, shots: str | None = None) -> None:
    """Sign in at the provider's login page, then consent; screenshots of both named
    `shots`-login and `shots`-consent."""
    eventually(lambda: dashboard.find_all("input[name=login]"), "the provider's login page")
    if shots:
        dashboard.shot(f"{shots}-login")
    dashboard.find("input[name=login]").send_keys(login)
    dashboard.find("input[name=password]").send_keys("any password")
    dashboard.find("button[type=submit]").click()
    eventually(
        lambda: dashboard.find_all("input[name=prompt][value=consent]"),
        "the provider's consent page",
    )
    if shots:
        dashboard.shot(f"{shots}-consent")
    dashboard.find("button[type=submit]").click()


def quiet_provider_pages(dashboard: Dashboard) -> None:
    """Drop the browser's messages about the provider's web font (see PROVIDER_PAGE_NOISE);
    whatever else was logged stays for the fixture's check."""
    kept = [
        e for e in dashboard.driver.get_log("browser") if PROVIDER_PAGE_NOISE not in e["message"]
    ]
    severe = [
        e["message"]
        for e in kept
        if e["level"] == "SEVERE" and not (e["source"] == "network" and " 40" in e["message"])
    ]
    assert not severe, severe


def test_sign_in_with_the_provider_lands_in_the_dashboard_as_the_mapped_tenant(
    dashboard: Dashboard, cluster: Cluster
) -> None:
    dashboard.wait_shown("oidc-sign-in")
    assert dashboard.text("oidc-sign-in") == "Sign in with Example SSO"
    dashboard.wait_shown("token")  # tokens still work beside it
    dashboard.shot("oidc-01-sign-in-page")
    dashboard.find(css("oidc-sign-in")).click()
    at_provider(dashboard, "alice", shots="oidc-02-provider")
    eventually(lambda: dashboard.text("who") == "acme", "signed in as acme")
    dashboard.wait_shown("jobs-range")
    dashboard.shot("oidc-03-dashboard-as-acme")
    quiet_provider_pages(dashboard)
    cookie = dashboard.session_cookie()
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert "trainyard_session" not in dashboard.script("return document.cookie")
    assert not dashboard.shown("nav-tenants")
    # A reload keeps the session, as with a token's.
    dashboard.reload()
    eventually(lambda: dashboard.text("who") == "acme", "still signed in after a reload")
    # Sign out and in again as a member of the admin group: the admin.
    dashboard.find(css("sign-out")).click()
    dashboard.wait_text("sign-in-error", "Signed out")
    dashboard.driver.delete_all_cookies()  # the provider's own session too (same host)
    dashboard.wait_shown("oidc-sign-in")
    dashboard.find(css("oidc-sign-in")).click()
    at_provider(dashboard, "root")
    eventually(lambda: dashboard.text("who") == "admin", "signed in as the admin")
    dashboard.wait_shown("nav-tenants")
    dashboard.open("tenants")
    eventually(lambda: "globex" in dashboard.find("#main").text, "the tenants listed")
    dashboard.shot("oidc-04-dashboard-as-admin")
    quiet_provider_pages(dashboard)


def test_a_person_in_no_mapped_group_is_told_why(dashboard: Dashboard, cluster: Cluster) -> None:
    dashboard.wait_shown("oidc-sign-in")
    dashboard.find(css("oidc-sign-in")).click()
    at_provider(dashboard, "mallory")
    dashboard.wait_shown("sign-in-refused")
    why = dashboard.text("sign-in-refused-why")
    assert "no group that Trainyard maps to a tenant" in why and "interns" in why
    dashboard.shot("oidc-05-refused")
    quiet_provider_pages(dashboard)
    dashboard.find(css("sign-in-again")).click()
    dashboard.wait_shown("oidc-sign-in")


def test_trainyard_login_sso_is_approved_in_the_browser(
    dashboard: Dashboard, cluster: Cluster, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env["TRAINYARD_HOME"] = str(tmp_path)
    command = [sys.executable, "-m", "cli", "login", "--server", cluster.url, "--sso"]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as login:
        assert login.stdout is not None
        first = login.stdout.readline()
        assert first.startswith("To sign in, open "), first
        # Read here, before communicate() reads the pipe past this stream's buffer.
        shown = first + login.stdout.readline() + login.stdout.readline()
        assert shown.endswith("\nWaiting for you to approve...\n"), shown
        assert "and check that it shows the code " in shown
        dashboard.driver.get(first.split("open ", 1)[1].strip())
        eventually(lambda: dashboard.find_all("form"), "the provider's device page")
        dashboard.shot("oidc-06-device-confirm")
        dashboard.find("button[autofocus]").click()
        at_provider(dashboard, "root")
        eventually(
            lambda: "Sign-in Success" in dashboard.driver.page_source, "the device flow's end"
        )
        dashboard.shot("oidc-07-device-success")
        quiet_provider_pages(dashboard)
        rest, _ = login.communicate(timeout=60)
    printed = shown + rest
    assert login.returncode == 0, printed
    assert f"logged in to {cluster.url} as the admin until " in printed
    (tmp_path / "login-output.txt").write_text(printed)
    # The other commands use the token it saved.
    listed = subprocess.run(
        [sys.executable, "-m", "cli", "tenants", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0 and "globex" in listed.stdout, listed.stderr
