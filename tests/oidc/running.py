"""A real OpenID Connect provider for the tests: `provider.mjs` (the certified npm
`oidc-provider`, installed into tests/oidc/node_modules by `./dev test`) run by the machine's
node on a free loopback port, and a person going through its pages over plain HTTP (its login
form takes any password; its consent and device pages are forms too).

Keys are made here (a private JWKS handed to the provider), so tests can also sign tokens with
the provider's own key but wrong claims, and rotate keys by restarting it with another set."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from harness.served import free_port

HERE = Path(__file__).parent
SCRIPT = HERE / "provider.mjs"
CLIENT_ID = "trainyard"


def provider_missing() -> str | None:
    if shutil.which("node") is None:
        return "node is missing: apt-get install nodejs npm"
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        return "oidc-provider is not installed: (cd tests/oidc && npm ci)"
    return None


def require_provider() -> None:
    """Skip (fail under CI, where `./dev test` installs it) without the provider."""
    why = provider_missing()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"the identity provider tests must run under CI: {why}")
    pytest.skip(f"{why} (./dev test installs it)")


def new_key(kid: str) -> RSAKey:
    return RSAKey.generate_key(
        2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"}, private=True
    )


@dataclass
class Provider:
    """The provider process. `accounts`: {login: {"groups": [...]}}; `ttl`: the provider's
    token lifetimes in seconds ({"RefreshToken": 3, ...})."""

    redirect_uris: list[str]
    accounts: dict[str, dict[str, Any]]
    ttl: dict[str, int] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    key: RSAKey = field(default_factory=lambda: new_key("first"))
    client_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    device_flow: bool = True
    process: asyncio.subprocess.Process | None = None
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="oidc-")))

    def __post_init__(self) -> None:
        self.accounts = json.loads(json.dumps(self.accounts))  # this provider's own copy

    @property
    def accounts_file(self) -> Path:
        return self.folder / "accounts.json"

    def set_groups(self, login: str, groups: list[str]) -> None:
        """Change a person's groups at the provider (from its next sign-in or refresh on)."""
        self.accounts[login] = {**self.accounts.get(login, {}), "groups": groups}
        self.accounts_file.write_text(json.dumps(self.accounts))

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settings(self, secret_file: Path, **more: str) -> dict[str, str]:
        """The control plane's environment for this provider (docs/sign-in.md)."""
        secret_file.write_text(self.client_secret + "\n")
        return {
            "TRAINYARD_OIDC_ISSUER": self.issuer,
            "TRAINYARD_OIDC_CLIENT_ID": CLIENT_ID,
            "TRAINYARD_OIDC_CLIENT_SECRET_FILE": str(secret_file),
            "TRAINYARD_OIDC_NAME": "Example SSO",
            **more,
        }

    async def start(self) -> Provider:
        config = {
            "port": self.port,
            "issuer": self.issuer,
            "keys": {"keys": [self.key.as_dict(private=True)]},
            "clients": [
                {
                    "client_id": CLIENT_ID,
                    "client_secret": self.client_secret,
                    "client_name": "Trainyard",
                    "redirect_uris": self.redirect_uris,
                    "grant_types": [
                        "authorization_code",
                        "refresh_token",
                        *(["urn:ietf:params:oauth:grant-type:device_code"] * self.device_flow),
                    ],
                    "response_types": ["code"],
                }
            ],
            "accounts_file": str(self.accounts_file),
            "ttl": self.ttl,
            "device_flow": self.device_flow,
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        self.accounts_file.write_text(json.dumps(self.accounts))
        node = shutil.which("node")
        assert node is not None
        self.process = await asyncio.create_subprocess_exec(
            node,
            str(SCRIPT),
            cwd=HERE,
            env={**os.environ, "OIDC_CONFIG": json.dumps(config)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 30)
        assert line.strip() == b"listening", line
        return self

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            with contextlib.suppress(ProcessLookupError):
                await asyncio.wait_for(self.process.wait(), 10)
        self.process = None
        shutil.rmtree(self.folder, ignore_errors=True)

    async def rotate(self, kid: str) -> RSAKey:
        """Restart with a new signing key (and its grants forgotten: the provider keeps them in
        memory); the old key is no longer published."""
        await self.stop()
        self.key = new_key(kid)
        await self.start()
        return self.key

    def sign(self, key: RSAKey | None = None, **claims: Any) -> str:
        """An ID token with these claims, signed with the provider's key (or `key`)."""
        now = int(time.time())
        body = {
            "iss": self.issuer,
            "aud": CLIENT_ID,
            "sub": "alice",
            "iat": now,
            "exp": now + 300,
            **claims,
        }
        body = {k: v for k, v in body.items() if v is not None}
        used = key or self.key
        return jwt.encode({"alg": "RS256", "kid": used.kid}, body, used)

    async def revoke(self, http: aiohttp.ClientSession, refresh_token: str) -> None:
        """Revoke a refresh token at the provider (RFC 7009), as an admin or the person would."""
        auth = {"Authorization": aiohttp.encode_basic_auth(CLIENT_ID, self.client_secret)}
        form = {"token": refresh_token, "token_type_hint": "refresh_token"}
        url = f"{self.issuer}/token/revocation"
        async with http.post(url, data=form, headers=auth) as answer:
            assert answer.status == 200, await answer.text()


class _Forms(HTMLParser):
    """The forms of a page: action and the values their fields would send."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.forms.append((found.get("action", ""), {}))
        elif tag == "input" and self.forms and "name" in found:
            self.forms[-1][1][found["name"]] = found.get("value", "")


async def approve(http: aiohttp.ClientSession, url: str, login: str) -> str:
    """Go through the provider's pages from `url` as the person `login` (any password), as a
    browser would: submit each page's form until none is left or the provider has sent the
    browser elsewhere; the last page's text."""
    async with http.get(url) as response:
        text, at = await response.text(), str(response.url)
    provider = urlsplit(at).netloc  # where `url` led: the provider's pages
    for _ in range(6):
        parser = _Forms()
        parser.feed(text)
        if not parser.forms or urlsplit(at).netloc != provider:
            return text
        action, data = parser.forms[0]
        if "login" in data:
            data.update(login=login, password="any password")
        async with http.post(urljoin(at, action), data=data) as response:
            text, at = await response.text(), str(response.url)
    raise AssertionError(f"the provider's pages did not end: {text[:500]}")


def browser_session() -> aiohttp.ClientSession:
    """An HTTP client that keeps cookies as a browser does, also for 127.0.0.1."""
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
