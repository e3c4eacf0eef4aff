"""The sign-in facade on a real Postgres, without HTTP or a provider: what the provider's
answer brings back is checked before anything is asked of it or stored, a loopback code is
traded once and only for its verifier, and only a sign-in session is ended as one. And the
loopback address the OpenAPI document states is exactly what the check takes."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from controlplane.identity.application import SignIn
from controlplane.identity.config import IdentityConfig
from controlplane.identity.loopback import LOOPBACK_PATTERN, loopback_uri
from controlplane.identity.mapping import GroupMapping
from controlplane.identity.provider import OidcProvider
from controlplane.identity.service import Identity, SignInRefused

CONFIG = IdentityConfig(
    # Nothing listens there: a test that reached the provider would fail saying so.
    issuer="http://127.0.0.1:9",
    client_id="trainyard",
    client_secret="secret",
    name="Example SSO",
    mapping=GroupMapping((("ml-acme", "acme"),), frozenset()),
)


@pytest.fixture
async def sign_in(pool: asyncpg.Pool) -> AsyncIterator[SignIn]:
    async with aiohttp.ClientSession() as http:
        identity = Identity(CONFIG, OidcProvider(CONFIG, http), pool)
        yield SignIn(identity, start="/ui/login/oidc", callback="/ui/login/callback")


ANSWER: dict[str, Any] = {"code": "c", "state": "s", "error": None, "error_description": None}


@pytest.mark.parametrize(
    ("binding", "answer", "status", "why"),
    [
        ("b", {"error": "access_denied"}, 401, "did not sign you in: access_denied"),
        ("b", {"error": "x", "error_description": "no"}, 401, "did not sign you in: no"),
        ("b", {"code": None}, 400, "lacks its code or state"),
        ("b", {"state": ""}, 400, "lacks its code or state"),
        (None, {}, 400, "another browser"),
        ("b" * 101, {}, 400, "another browser"),
        ("b", {"state": "s" * 101}, 400, "another browser"),
        ("b", {"code": "c" * 2001}, 400, "another browser"),
        ("b", {"state": "s\0"}, 400, "another browser"),  # no stored state holds a NUL
        ("b", {}, 400, "another browser"),  # a state of no sign-in started
    ],
)
async def test_the_providers_answer_is_checked_before_it_is_traded(
    sign_in: SignIn,
    binding: str | None,
    answer: dict[str, Any],
    status: int,
    why: str,
) -> None:
    with pytest.raises(SignInRefused) as refused:
        await sign_in.finish_browser("http://here", binding, **{**ANSWER, **answer})
    assert refused.value.status == status and why in str(refused.value)
    assert refused.value.loopback is None


async def test_the_redirect_uri_is_under_the_public_url_when_the_operator_set_one(
    sign_in: SignIn, pool: asyncpg.Pool
) -> None:
    assert sign_in.redirect_uri("http://here:8080") == "http://here:8080/ui/login/callback"
    config = dataclasses.replace(CONFIG, public_url="https://ty.example")
    identity = Identity(config, sign_in.identity.provider, pool)
    public = SignIn(identity, start="/ui/login/oidc", callback="/ui/login/callback")
    assert public.redirect_uri("http://here:8080") == "https://ty.example/ui/login/callback"


async def test_an_unknown_loopback_code_and_an_issued_token_are_refused_naming_the_field(
    sign_in: SignIn,
) -> None:
    with pytest.raises(SignInRefused) as refused:
        await sign_in.finish_loopback("made-up", "x" * 43)
    assert (refused.value.status, refused.value.field) == (401, "code")
    with pytest.raises(SignInRefused) as refused:
        await sign_in.end("ty_an_issued_token")
    assert (refused.value.status, refused.value.field) == (400, "Authorization")


@pytest.mark.parametrize(
    "cli",
    [
        *("http://127.0.0.1:9/cb", "http://[::1]:65535", "http://127.0.0.1:0080/a/b%20c"),
        *("http://127.0.0.1:9/é", "http://127.0.0.1:0/"),
        *("http://127.0.0.1/cb", "http://127.0.0.1:65536/", "https://127.0.0.1:9/"),
        *("http://localhost:9/", "http://evil.example:80/cb", "http://u@127.0.0.1:9/"),
        *("http://127.0.0.1:9/cb?", "http://127.0.0.1:9/cb#x", "http://127.0.0.1:9/a b"),
        *("HTTP://127.0.0.1:9/", " http://127.0.0.1:9/", "http://127.0.0.1:9/\0", ""),
        *("http://127.0.0.1:9/\t", "http://[::2]:9/", "http://127.0.0.1:+9/"),
        "http://127.0.0.1:9/" + "a" * 200,
    ],
)
def test_the_stated_loopback_pattern_is_what_the_check_takes(cli: str) -> None:
    try:
        loopback_uri(cli)
        accepted = True
    except ValueError:
        accepted = False
    stated = re.fullmatch(LOOPBACK_PATTERN, cli) is not None and len(cli) <= 200
    assert stated == accepted
