"""Which addresses a webhook may be sent to: public ones, and those in networks the operator
allows. A tenant names the URL, and the relay POSTs from the control plane's own network, so
without this a tenant could make the control plane call its database, its metadata service
(169.254.169.254) or anything else only it can reach. Pure: no lookups here (see `targets`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_NETWORKS_ENV = "TRAINYARD_WEBHOOK_ALLOW_NETWORKS"
"""Networks (CIDR, separated by commas or spaces) the operator allows webhooks to, although
they are not public: e.g. `10.20.0.0/16` for receivers on the operator's own network."""

NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def parse_networks(text: str) -> tuple[Network, ...]:
    """The networks of an allow list; ValueError naming the entry that is not one."""
    networks: list[Network] = []
    for entry in text.replace(",", " ").split():
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(
                f"{ALLOW_NETWORKS_ENV}: {entry!r} is not a network, e.g. 10.20.0.0/16 or fd00::/8"
            ) from None
    return tuple(networks)


def refusal(address: Address, allowed: Sequence[Network]) -> str | None:
    """Why a webhook may not be sent to `address`; None when it may."""
    if any(address in network for network in allowed):
        return None
    kind = _kind(address)
    if kind is None:
        return None
    return f"{address} is {kind} (allow it with {ALLOW_NETWORKS_ENV})"


def _kind(address: Address) -> str | None:
    """What makes `address` not public, checked in this order so that the reason is the most
    telling one (127.0.0.1 is private too, but "loopback" says more)."""
    if isinstance(address, ipaddress.IPv6Address) and (
        address.ipv4_mapped is not None
        or address.sixtofour is not None
        or address.teredo is not None
        or address in NAT64
    ):
        # Each reaches an IPv4 address through the IPv6 one, and may reach a refused one.
        return "an IPv6 address embedding an IPv4 address"
    checks = (
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "a loopback address"),
        (address.is_link_local, "a link-local address"),
        (address.is_multicast, "a multicast address"),
        (address.is_private, "a private address"),
        (address.is_reserved, "a reserved address"),
        (isinstance(address, ipaddress.IPv6Address) and address.is_site_local, "site-local"),
        (not address.is_global, "not a public address"),
    )
    return next((kind for refused, kind in checks if refused), None)
