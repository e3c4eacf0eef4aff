"""`trainyard login --sso` where the provider offers no device flow: the loopback redirect
(RFC 8252 §7.3), brokered by the control plane. The CLI listens on the loopback address and
opens the dashboard's sign-in with its address and a PKCE challenge of its own; once the person
signed in, the control plane sends the browser to that address with a one-time code, which only
the CLI holding the verifier can trade for its token (pure checks here)."""

from __future__ import annotations

import base64
import hashlib
import re
from urllib.parse import urlsplit

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1"})
"""IP literals only (RFC 8252 §8.3): `localhost` may resolve elsewhere."""
MAX_LOOPBACK = 200
LOOPBACK_PATTERN = (
    r"^http://(127\.0\.0\.1|\[::1\]):"
    r"0*([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
    r"(/[^?#\u0000-\u0020\u007f]*)?$"
)
"""What `loopback_uri` takes, as the OpenAPI document states it: a port in 0..65535 and a path
without a query, a fragment, spaces or control characters (they would end up in the Location
header the browser is sent to)."""
_LOOPBACK = re.compile(LOOPBACK_PATTERN)
CHALLENGE_PATTERN = r"^[A-Za-z0-9_-]{43}$"
_CHALLENGE = re.compile(CHALLENGE_PATTERN)


def loopback_uri(text: str) -> str:
    """`text` if it is a loopback address the CLI may listen on: http, 127.0.0.1 or [::1], a
    port, a path, nothing else (`LOOPBACK_PATTERN`); ValueError saying what is wrong otherwise.
    Any other address would send the person's one-time code to another machine."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"cli must be a loopback address, not {text[:100]!r}") from exc
    if (
        len(text) > MAX_LOOPBACK
        or _LOOPBACK.fullmatch(text) is None
        or parts.scheme != "http"
        or parts.hostname not in LOOPBACK_HOSTS
        or port is None
        or parts.username is not None
        or parts.password is not None
        or parts.query
        or parts.fragment
    ):
        raise ValueError(
            f"cli must be http://127.0.0.1:PORT/PATH or http://[::1]:PORT/PATH, not {text[:100]!r}"
        )
    return text


def challenge_ok(text: str) -> bool:
    """A PKCE S256 challenge: 43 characters of base64url."""
    return _CHALLENGE.fullmatch(text) is not None


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
