"""What the dashboard's browser tests share: a cluster served as operators run it (`trainyard
serve` as a child process, a real process-runtime agent, tenants made through the API), a
headless Chromium from Debian's packages, and waiting for what the page shows.

Selenium blocks while the browser works, so the cluster's asynchronous parts (the agent, the
control plane's process) live on an event loop of their own, in a thread; the tests themselves
are plain functions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 30.0

T = TypeVar("T")


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        return f"{' and '.join(missing)} missing: apt-get install chromium chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium missing: pip install -e '.[test]'"
    return None


def require_browser() -> None:
    """Skip (fail under CI, where `./dev test` installs them) without the browser."""
    why = browser_missing()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"the browser tests must run under CI: {why}")
    pytest.skip(f"{why} (./dev test installs them as root)")


class Background:
    """An event loop in a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass
class Response:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


def request(
    url: str,
    method: str = "GET",
    *,
    token: str | None = None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """One HTTP request (JSON in, JSON out) as any client makes it."""
    sent = dict(headers or {})
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        sent["Content-Type"] = "application/json"
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            raw, status, got = answer.read(), answer.status, dict(answer.headers)
    except urllib.error.HTTPError as refused:
        raw, status, got = refused.read(), refused.code, dict(refused.headers)
    text = raw.decode()
    try:
        parsed: Any = json.loads(text) if text else None
    except json.JSONDecodeError:
        parsed = text
    return Response(status, parsed, got)


def eventually(check: Callable[[], T | None], what: str, seconds: float = WAIT_S) -> T:
    """Poll `check` until it returns something truthy; fail naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    last: T | None = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # an element replaced as the page redraws
            last = check()
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds:.0f}s: {what} (last seen: {last!r})")


@contextlib.contextmanager
def offline_selenium() -> Iterator[None]:
    """Selenium Manager never runs (the driver's path is always given) and, should it, never
    downloads a browser or a driver."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")
        yield


def screenshot_dir(default: Path) -> Path:
    """Where screenshots go: $TRAINYARD_SCREENSHOTS (CI keeps it as an artifact), else
    `default`."""
    chosen = os.environ.get("TRAINYARD_SCREENSHOTS")
    path = Path(chosen) if chosen else default
    path.mkdir(parents=True, exist_ok=True)
    return path
