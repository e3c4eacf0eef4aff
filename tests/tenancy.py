"""Tenants and tokens for tests that go through the authenticated API."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tokens:
    acme: str
    globex: str
    admin: str
