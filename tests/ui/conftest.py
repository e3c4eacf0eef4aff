"""A cluster and a browser for the dashboard's tests, each started once per module (a browser
starts in about a second, the cluster in a few) and shared by its tests; each test signs in
afresh."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.jobs.locations import RESULTS_ROOTS_ENV
from controlplane.settings import ARTIFACTS_DIR_ENV
from harness.served import ServedControlPlane
from tests.cluster import RunningAgent, agent_config, learner_space
from tests.conftest import fresh_database
from tests.ui.browser import (
    CHROMEDRIVER,
    CHROMIUM,
    Background,
    Response,
    eventually,
    offline_selenium,
    request,
    require_browser,
    screenshot_dir,
)
from tests.ui.pages import Dashboard


@dataclasses.dataclass
class Cluster:
    url: str
    admin: str
    acme: str
    globex: str
    bg: Background
    served: ServedControlPlane
    shared: Path

    def api(self, method: str, path: str, token: str, body: Any = None) -> Response:
        return request(self.url + path, method, token=token, body=body)

    def submit(self, token: str, command: list[str], **manifest: Any) -> str:
        document = {"name": "job", "image": "img", "command": command, "memory_mb": 256}
        answer = self.api("POST", "/v1/jobs", token, {**document, **manifest})
        assert answer.status == 201, answer.body
        return str(answer.body["id"])

    def state(self, token: str, job_id: str) -> str:
        answer = self.api("GET", f"/v1/jobs/{job_id}", token)
        assert answer.status == 200, answer.body
        return str(answer.body["state"])

    def until_state(self, token: str, job_id: str, *states: str, seconds: float = 60) -> str:
        return eventually(
            lambda: s if (s := self.state(token, job_id)) in states else None,
            f"job {job_id} in {states}",
            seconds,
        )

    def results(self) -> str:
        """A results location below the operator's results root (learners store there)."""
        return (self.shared / "results" / uuid.uuid4().hex).as_uri()

    def restart(self) -> None:
        """Stop the control plane (SIGTERM, as a service manager does) and start it again on
        its port: every stream the browser holds is dropped."""
        self.bg.run(self.served.stop())
        self.bg.run(self.served.start())


async def _agent(url: str, tmp: Path, artifacts: Path) -> RunningAgent:
    config = dataclasses.replace(
        agent_config(tmp), cpus=16, memory_mb=65536, artifacts_dir=artifacts
    )
    return await RunningAgent(url, config, fake_gpus=2).started()


@pytest.fixture(scope="session")
def browser_present() -> None:
    """Before anything is started for them: the browser tests skip at once without one."""
    require_browser()


@pytest.fixture(scope="module")
def cluster(browser_present: None, pg_server: str, template_db: str) -> Iterator[Cluster]:
    bg = Background()
    stack = contextlib.AsyncExitStack()
    try:
        url = bg.run(stack.enter_async_context(fresh_database(pg_server, template_db)))
        # Where learners, running as users of their own, can reach their folders; `shared`,
        # the operator's data and results root, they may write to as well.
        space = learner_space()
        shared = space / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        artifacts = space / "artifacts"
        env = {ARTIFACTS_DIR_ENV: str(artifacts), RESULTS_ROOTS_ENV: str(shared)}
        served = ServedControlPlane(url, space / "server", env=env)
        bg.run(served.start())
        stack.push_async_callback(served.stop)
        agent = bg.run(_agent(url, shared, artifacts))
        stack.push_async_callback(agent.finish)
        admin = served.admin_token
        tokens = {}
        for name in ("acme", "globex"):
            made = request(f"{served.url}/v1/tenants", "POST", token=admin, body={"name": name})
            assert made.status == 201, made.body
            tokens[name] = made.body["token"]
        yield Cluster(served.url, admin, tokens["acme"], tokens["globex"], bg, served, shared)
    finally:
        bg.run(stack.aclose(), timeout=90)
        bg.close()


@pytest.fixture(scope="module")
def driver(cluster: Cluster) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root in a container, Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--lang=en-US",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with offline_selenium():
        browser = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def dashboard(
    driver: Any, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Dashboard]:
    """The browser, signed out, at the dashboard's page; checked afterwards for errors its
    scripts logged (a CSP violation, an exception)."""
    shots = screenshot_dir(tmp_path_factory.getbasetemp() / "screenshots")
    driver.set_window_size(1280, 900)
    driver.get(cluster.url + "/ui/")
    driver.delete_all_cookies()
    page = Dashboard(driver, cluster.url, shots)
    yield page
    page.assert_no_script_errors()
