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
_CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")


def loopback_uri(text: str) -> str:
    """`text` if it is a loopback address the CLI may listen on: http, 127.0.0.1 or [::1], a
    port, nothing else; ValueError saying what is wrong otherwise. Any other address would send
    the person's one-time code to another machine."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"cli must be a loopback address, not {text[:100]!r}") from exc
    if (
        len(text) > 200
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
