"""`trainyard login --sso`: sign in through the organisation's identity provider, brokered by
the control plane (which holds the provider's client secret and checks the person's groups),
with the device flow (RFC 8628) where the provider offers one: the person opens the address
shown, anywhere, and approves; else with the loopback redirect (RFC 8252): the browser on this
machine signs in and brings a one-time code back to this command, which alone can trade it
(PKCE). Either way the command saves the bearer token the control plane gives back, as `login`
saves a token."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from trainyard.api import ApiClient, NotFound, UsageError

SLOW_DOWN_S = 5.0
"""RFC 8628 §3.5: after `slow_down`, poll this much less often."""


NO_PROVIDER = (
    "this server has no identity provider configured: sign in with a token, "
    "`trainyard login --token-file FILE`"
)
WAIT_S = 600.0
"""How long the loopback sign-in waits for the browser (the server's sign-in lasts as long)."""


async def sso_sign_in(server: str, say: Callable[[str], None]) -> dict[str, Any]:
    """The control plane's answer once the person signed in: {token, tenant, is_admin,
    expires_at}. `say` shows the person what to do."""
    async with ApiClient(server, "") as api:
        providers = await api.request("GET", "/ui/login")
        if not isinstance(providers, dict) or not providers.get("oidc"):
            raise UsageError(NO_PROVIDER)
        try:
            device = await api.request("POST", "/v1/login/device")
        except NotFound:
            # The provider offers no device flow.
            return await _loopback(api, say)
        return await _device(api, device, say)


async def _device(
    api: ApiClient, device: dict[str, Any], say: Callable[[str], None]
) -> dict[str, Any]:
    complete = device.get("verification_uri_complete")
    if complete:
        say(f"To sign in, open {complete}")
        say(f"and check that it shows the code {device['user_code']}.")
    else:
        say(f"To sign in, open {device['verification_uri']}")
        say(f"and enter the code {device['user_code']}.")
    say("Waiting for you to approve...")
    interval = float(device.get("interval") or 5)
    deadline = time.monotonic() + float(device.get("expires_in") or 600)
    while time.monotonic() < deadline:
        await asyncio.sleep(interval)
        answer = await api.request(
            "POST", "/v1/login/device/token", body={"device_code": device["device_code"]}
        )
        if "token" in answer:
            result: dict[str, Any] = answer
            return result
        if answer.get("pending") == "slow_down":
            interval += SLOW_DOWN_S
    raise UsageError("the code expired before it was approved: run `trainyard login --sso` again")


async def _loopback(api: ApiClient, say: Callable[[str], None]) -> dict[str, Any]:
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    challenge = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    answer: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()

    async def callback(request: web.Request) -> web.Response:
        if not answer.done() and ("code" in request.query or "error" in request.query):
            answer.set_result(dict(request.query))
        return web.Response(text="Trainyard: you may close this tab and go back to the terminal.\n")

    app = web.Application()
    app.router.add_get("/callback", callback)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        # The loopback address only: nothing on the network can bring a code here.
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        query = urlencode({"cli": f"http://127.0.0.1:{port}/callback", "cli_challenge": challenge})
        url = f"{api.server}/ui/login/oidc?{query}"
        say(f"To sign in, open {url}")
        say("in a browser on this machine (the provider offers no device flow).")
        say("Waiting for you to sign in...")
        try:
            got = await asyncio.wait_for(answer, WAIT_S)
        except TimeoutError:
            raise UsageError(
                "the sign-in did not finish in time: run `trainyard login --sso` again"
            ) from None
    finally:
        await runner.cleanup()
    if "error" in got:
        raise UsageError(f"the sign-in failed: {got['error']}")
    result: dict[str, Any] = await api.request(
        "POST", "/v1/login/loopback/token", body={"code": got["code"], "verifier": verifier}
    )
    return result
