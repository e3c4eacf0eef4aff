"""Bearer tokens: random text shown once, stored only as its sha256."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field

PREFIX = "ty_"
"""Makes a leaked token recognisable to secret scanners and to people."""


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A new token: its public id, its hash, and its text, which is never stored."""

    token_id: str
    sha256: str
    plaintext: str = field(repr=False)  # kept out of logs and tracebacks


def new_token() -> IssuedToken:
    # 32 random bytes: far beyond guessing, so an unsalted fast hash is safe to store.
    plaintext = PREFIX + secrets.token_urlsafe(32)
    return IssuedToken(
        token_id=secrets.token_hex(8), sha256=token_sha256(plaintext), plaintext=plaintext
    )


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
