"""The dashboard as the tests drive it: sign in, go to a page, read what it shows, take its
screenshot. Elements are found by their `data-test` attributes, which the page keeps stable."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tests.ui.browser import eventually

# Messages the browser logs that are expected: the page asks who is signed in before anyone
# is (401), and the tests make refused requests on purpose.
EXPECTED_NETWORK = (" 400 ", " 401 ", " 403 ", " 404 ", " 409 ")


def css(test: str) -> str:
    return f"[data-test='{test}']"


class Dashboard:
    def __init__(self, driver: Any, url: str, shots: Path) -> None:
        self.driver = driver
        self.url = url
        self.shots = shots

    # -- finding ---------------------------------------------------------------------------

    def find(self, selector: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def find_all(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def text(self, test: str) -> str:
        return str(self.find(css(test)).text)

    def shown(self, test: str) -> bool:
        return any(e.is_displayed() for e in self.find_all(css(test)))

    def wait_text(self, test: str, contains: str, seconds: float = 30) -> str:
        return eventually(
            lambda: t if contains in (t := self.text(test)) else None,
            f"{test} showing {contains!r}",
            seconds,
        )

    def wait_shown(self, test: str, seconds: float = 30) -> None:
        eventually(lambda: self.shown(test), f"{test} shown", seconds)

    def script(self, code: str, *args: Any) -> Any:
        return self.driver.execute_script(code, *args)

    def fetch(self, path: str, method: str = "GET", headers: dict[str, str] | None = None) -> int:
        """The status of a fetch() made by the page itself (its cookie, its origin)."""
        return int(
            self.driver.execute_async_script(
                "const [path, method, headers, done] = arguments;"
                "fetch(path, {method, headers, body: method === 'GET' ? undefined : '{}'})"
                ".then(r => done(r.status), e => done(String(e)));",
                path,
                method,
                headers or {},
            )
        )

    # -- going places ----------------------------------------------------------------------

    def open(self, route: str) -> None:
        """Go to `#/route` (the whole page is loaded again when it was elsewhere)."""
        self.driver.get(f"{self.url}/ui/#/{route}")

    def reload(self) -> None:
        self.driver.refresh()

    def sign_in(self, token: str) -> None:
        if not self.shown("token"):
            self.driver.get(f"{self.url}/ui/")
            self.wait_shown("token")
        field = self.find(css("token"))
        field.clear()
        field.send_keys(token)
        self.find(css("sign-in-submit")).click()
        eventually(lambda: self.text("who"), "the signed-in name in the header")

    def session_cookie(self) -> dict[str, Any]:
        cookies = {c["name"]: c for c in self.driver.get_cookies()}
        return dict(cookies["trainyard_session"])

    def shot(self, name: str) -> Path:
        """The whole page (beyond the window, through the DevTools protocol), as a PNG."""
        path = self.shots / f"{name}.png"
        size = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"captureBeyondViewport": True, "clip": clip}
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def phone(self) -> None:
        self.driver.set_window_size(390, 844)

    def laptop(self) -> None:
        self.driver.set_window_size(1280, 900)

    def assert_no_script_errors(self) -> None:
        logs = self.driver.get_log("browser")
        errors = [
            entry["message"]
            for entry in logs
            if entry["level"] == "SEVERE"
            and not (
                entry["source"] == "network"
                and any(status in entry["message"] for status in EXPECTED_NETWORK)
            )
        ]
        assert not errors, errors
