"""Where a webhook may go: its host resolved, and every address it resolves to allowed
(`addresses`), both when the job is submitted (a 403 naming `webhook_url`: the tenant may not
send there) and at each delivery (DNS may have changed since).

At delivery the check is the resolver the relay's connections use, so the addresses checked
are the very ones connected to: a name that resolves to a public address for the check and to
127.0.0.1 for the connection (DNS rebinding) is not looked up twice. URLs naming an address
skip aiohttp's resolver, so `check_literal` covers them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult

from controlplane.refusals import Refusal, Refused
from controlplane.webhooks.addresses import Address, Network, refusal

LOOKUP_S = 5.0
"""How long a submission waits for its webhook's host to resolve before it is refused."""


class TargetRefused(OSError):
    """A webhook's host is, or resolves to, an address it may not go to (or, at submission,
    does not resolve). An OSError, as a resolver's failures are: aiohttp passes it on as the
    cause of the connection's failure."""


def host_of(url: str) -> str:
    host = urlsplit(url).hostname  # lower case, without an IPv6 address's brackets
    if not host:
        raise TargetRefused(f"{url!r} names no host")
    return host


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def check_addresses(host: str, addresses: Iterable[str], allowed: Sequence[Network]) -> None:
    """Refuse unless `host` has addresses and each of them is allowed."""
    found = [ipaddress.ip_address(a.split("%", 1)[0]) for a in addresses]  # without a scope
    if not found:
        raise TargetRefused(f"host {host!r} has no address")
    for address in found:
        if (why := refusal(address, allowed)) is not None:
            shown = "" if str(address) == host else f"{host!r} resolves to "
            raise TargetRefused(f"webhooks may not go to {shown}{why}")


def check_literal(url: str, allowed: Sequence[Network]) -> bool:
    """Refuse a URL naming a refused address; whether it names an address at all."""
    host = host_of(url)
    address = _literal(host)
    if address is None:
        return False
    check_addresses(host, [str(address)], allowed)
    return True


class CheckingResolver(AbstractResolver):
    """A resolver that answers only with allowed addresses, and refuses a host that has any
    other: one public address among private ones would not make the private ones safe."""

    def __init__(self, inner: AbstractResolver, allowed: Sequence[Network]) -> None:
        self._inner = inner
        self.allowed = tuple(allowed)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_UNSPEC
    ) -> list[ResolveResult]:
        # A host that does not resolve raises gaierror: at delivery, a failure tried again later.
        results = await self._inner.resolve(host, port, family)
        check_addresses(host, (result["host"] for result in results), self.allowed)
        return results

    async def check_url(self, url: str) -> None:
        """Refuse a URL whose host is, or resolves to, any address not allowed."""
        if check_literal(url, self.allowed):
            return
        host = host_of(url)
        try:
            await self.resolve(host)
        except socket.gaierror as exc:
            raise TargetRefused(f"cannot resolve host {host!r}: {exc.strerror}") from exc

    async def admit(self, url: str, field: str) -> None:
        """`check_url` for a submission: refused (FORBIDDEN, naming `field`: the URL is well
        formed, the service may not deliver there) as the relay would refuse to deliver there,
        or when the host does not resolve within `LOOKUP_S`."""
        try:
            async with asyncio.timeout(LOOKUP_S):
                await self.check_url(url)
        except TargetRefused as exc:
            raise Refusal(Refused.FORBIDDEN, str(exc), field=field) from exc
        except TimeoutError:
            raise Refusal(
                Refused.FORBIDDEN,
                f"the webhook's host did not resolve within {LOOKUP_S:g}s",
                field=field,
            ) from None

    async def close(self) -> None:
        await self._inner.close()
