"""Webhooks go only to public addresses, or to networks the operator allows: refused at
submission (403 naming `webhook_url`, nothing written) and again at delivery (recorded as a
failed delivery with the reason, not retried); redirects are not followed."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.test_utils import TestClient, TestServer

from controlplane.http.app import create_app
from controlplane.webhooks.addresses import parse_networks, refusal
from controlplane.webhooks.relay import RelayConfig
from controlplane.webhooks.retries import RetryPolicy
from controlplane.webhooks.targets import CheckingResolver, TargetRefused
from tests.cluster import Plane
from tests.controlplane.webhooks.test_webhooks import (
    FAST,
    attempts,
    fail,
    relaying,
    rows,
    until_settled,
)
from tests.receivers import receiving
from tests.tenancy import Tokens, auth

Client = TestClient[Any, Any]

REFUSED = [
    "127.0.0.1",
    "127.5.6.7",
    "169.254.169.254",
    "10.1.2.3",
    "172.16.0.1",
    "192.168.1.1",
    "100.64.0.1",
    "0.0.0.0",
    "224.0.0.1",
    "239.1.2.3",
    "240.0.0.1",
    "255.255.255.255",
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "ff02::1",
    "::ffff:127.0.0.1",
    "::ffff:8.8.8.8",
    "64:ff9b::a00:1",
    "2002:7f00:1::1",
]

# Refused at submission: each names, or resolves to, a refused address ("localhost" resolves to
# loopback; ".invalid" never resolves).
REFUSED_URLS = [
    "http://127.0.0.1:8080/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.7/hook",
    "http://192.168.0.1:9000/",
    "http://[::1]:8080/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[fe80::1]/hook",
    "http://2130706433/hook",  # 127.0.0.1 written as a number
    "http://0x7f.1/hook",
    "http://localhost:8080/hook",
    "http://no-such-host.invalid/hook",
]


@pytest.mark.parametrize("address", REFUSED)
def test_addresses_that_are_not_public_are_refused(address: str) -> None:
    assert refusal(ipaddress.ip_address(address), ()) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert refusal(ipaddress.ip_address(address), ()) is None


def test_the_operator_allows_networks() -> None:
    allowed = parse_networks("10.20.0.0/16, 127.0.0.0/8 fd00::/8")
    assert refusal(ipaddress.ip_address("10.20.3.4"), allowed) is None
    assert refusal(ipaddress.ip_address("127.0.0.1"), allowed) is None
    assert refusal(ipaddress.ip_address("fd12::1"), allowed) is None
    assert refusal(ipaddress.ip_address("10.21.0.1"), allowed) is not None
    assert refusal(ipaddress.ip_address("169.254.169.254"), allowed) is not None
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33'"):
        parse_networks("10.0.0.0/33")


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    """The control plane as served, with no network allowed (the default)."""
    async with TestClient(TestServer(create_app(db_url, poll_interval=0.2))) as client:
        yield client


@pytest.mark.parametrize("url", REFUSED_URLS)
async def test_a_refused_webhook_url_is_a_403_naming_the_field_and_writes_nothing(
    client: Client, tokens: Tokens, url: str
) -> None:
    manifest = {"name": "j", "image": "i", "command": ["x"], "webhook_url": url}
    response = await client.post("/v1/jobs", json=manifest, headers=auth(tokens.acme))
    assert response.status == 403, await response.text()
    body = await response.json()
    assert body["field"] == "webhook_url"
    listed = await (await client.get("/v1/jobs", headers=auth(tokens.acme))).json()
    assert listed["jobs"] == []


async def test_an_allowed_network_may_be_notified(db_url: str, tokens: Tokens) -> None:
    app = create_app(db_url, poll_interval=0.2, relay=FAST)  # allows 127.0.0.0/8
    async with TestClient(TestServer(app)) as client, receiving() as receiver:
        manifest = {"name": "j", "image": "i", "command": ["x"], "webhook_url": receiver.url}
        response = await client.post("/v1/jobs", json=manifest, headers=auth(tokens.acme))
        assert response.status == 201, await response.text()


NOT_ALLOWED = RelayConfig(
    retries=RetryPolicy(max_attempts=5, first_backoff_s=0.05),
    timeout_s=2,
    lease_s=5,
    poll_interval_s=0.2,
)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "[::ffff:127.0.0.1]"])
async def test_delivery_to_a_refused_address_fails_at_once_and_sends_nothing(
    plane: Plane, host: str
) -> None:
    """A job whose URL was allowed when submitted (by an operator's setting since removed, or
    by DNS that changed since) is checked again at each delivery."""
    async with receiving() as receiver:
        url = receiver.url.replace("127.0.0.1", host)
        job_id = await plane.submit(["true"], webhook_url=url)
        await fail(plane, job_id)
        async with relaying(plane, NOT_ALLOWED):
            await until_settled(plane.pool, 1)
        assert receiver.received == []
    [row] = await rows(plane.pool)
    assert (row["state"], row["attempts"]) == ("failed", 1)  # not tried again
    assert "allow it with TRAINYARD_WEBHOOK_ALLOW_NETWORKS" in row["last_error"]
    [attempt] = await attempts(plane, job_id)
    assert attempt.model_dump()["error"] == row["last_error"]


class Answers(AbstractResolver):
    """A DNS server's answers, as a test sets them."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_UNSPEC
    ) -> list[ResolveResult]:
        return [
            ResolveResult(hostname=host, host=a, port=port, family=0, proto=0, flags=0)
            for a in self.addresses
        ]

    async def close(self) -> None:
        pass


async def test_a_name_is_refused_if_any_of_its_addresses_is() -> None:
    """A public address beside a private one does not make the private one safe: the
    connection could go to either. What the resolver answers is what is connected to, so a
    name that changes its answers between the check and the connection cannot slip through."""
    mixed = CheckingResolver(Answers("93.184.215.14", "10.0.0.5"), ())
    with pytest.raises(TargetRefused, match=r"resolves to 10\.0\.0\.5 is a private address"):
        await mixed.resolve("hooks.example.org", 443)
    with pytest.raises(TargetRefused, match=r"resolves to 10\.0\.0\.5"):
        await mixed.check_url("https://hooks.example.org/x")
    public = CheckingResolver(Answers("93.184.215.14"), ())
    [answer] = await public.resolve("hooks.example.org", 443)
    assert answer["host"] == "93.184.215.14"
    nothing = CheckingResolver(Answers(), ())
    with pytest.raises(TargetRefused, match="has no address"):
        await nothing.check_url("https://hooks.example.org/x")


async def test_redirects_are_not_followed(plane: Plane) -> None:
    async with receiving() as target:
        redirects: list[str] = []

        async def redirect(request: web.Request) -> web.Response:
            redirects.append(request.path)
            raise web.HTTPTemporaryRedirect(target.url)

        app = web.Application()
        app.router.add_post("/hook", redirect)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        try:
            config = RelayConfig(
                allow_networks=FAST.allow_networks,
                retries=RetryPolicy(max_attempts=1),
                timeout_s=2,
                lease_s=5,
                poll_interval_s=0.2,
            )
            job_id = await plane.submit(["true"], webhook_url=f"http://{host}:{port}/hook")
            await fail(plane, job_id)
            async with relaying(plane, config):
                await until_settled(plane.pool, 1)
        finally:
            await runner.cleanup()
        assert redirects == ["/hook"]
        assert target.received == []
    [row] = await rows(plane.pool)
    assert (row["state"], row["last_status"]) == ("failed", 307)
