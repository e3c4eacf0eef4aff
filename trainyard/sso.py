"""`trainyard login --sso`: sign in through the organisation's identity provider with the
device flow (RFC 8628), brokered by the control plane (which holds the provider's client
secret and checks the person's groups): the person opens the address shown, anywhere, approves,
and the command saves the bearer token the control plane gives back, as `login` saves a token."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from trainyard.api import ApiClient, NotFound, UsageError

SLOW_DOWN_S = 5.0
"""RFC 8628 §3.5: after `slow_down`, poll this much less often."""


async def device_sign_in(server: str, say: Callable[[str], None]) -> dict[str, Any]:
    """The control plane's answer once the person approved: {token, tenant, is_admin,
    expires_at}. `say` shows the person what to do."""
    async with ApiClient(server, "") as api:
        try:
            device = await api.request(
                "POST",
                "/v1/login/device",
                not_found="this server has no identity provider configured (or it offers no "
                "device flow): sign in with a token, `trainyard login --token-file FILE`",
            )
        except NotFound as exc:
            raise UsageError(str(exc)) from exc
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
