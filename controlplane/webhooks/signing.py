"""Signing deliveries, and checking a signature as a receiver does.

`Trainyard-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>...]`, where each v1 is the hex
HMAC-SHA256, keyed with one of the tenant's secrets, of the text `<t>.` followed by the exact
request body. A receiver recomputes it with its secret, compares in constant time, and refuses
a `t` too far from its clock (a replayed old request). During a rotation's grace period a
delivery carries one v1 for each secret that is still valid, newest first.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence

HEADER = "Trainyard-Signature"
TOLERANCE_S = 300
"""How far from the receiver's clock a signature's time may be (what `verify` accepts)."""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of `<timestamp>.<body>` keyed with `secret`."""
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign(secrets: Sequence[str], timestamp: int, body: bytes) -> str:
    """The header value for a body sent at `timestamp`, with one v1 per secret."""
    if not secrets:
        raise ValueError("a delivery is signed with at least one secret")
    return ",".join([f"t={timestamp}", *(f"v1={signature(s, timestamp, body)}" for s in secrets)])


def verify(
    header: str,
    secret: str,
    body: bytes,
    *,
    tolerance_s: float = TOLERANCE_S,
    now: float | None = None,
) -> bool:
    """Whether `header` signs `body` with `secret`, at a time within `tolerance_s` of `now`."""
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1":
            candidates.append(value)
    if timestamp is None:
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    expected = signature(secret, timestamp, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)
