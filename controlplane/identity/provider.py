"""The control plane's side of the OpenID Connect provider: its discovery document, its
published keys (JWKS), the token endpoint (authorization code with PKCE, device code, refresh),
the revocation endpoint (RFC 7009), and the verification of the ID tokens it signs (joserfc:
signature, issuer, audience, expiry, nonce).

Keys rotate: a token signed with a key id the cached JWKS lacks fetches the JWKS again, at most
once per `refetch_s`, so that a stream of tokens with made-up key ids cannot make the control
plane hammer the provider."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from controlplane.identity.config import IdentityConfig
from controlplane.identity.loopback import s256

ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"]
"""Asymmetric signatures only: never `none`, never an HMAC keyed with something public."""
LEEWAY_S = 60
"""Clock skew tolerated between the provider and the control plane."""
REFETCH_S = 60.0
TIMEOUT = aiohttp.ClientTimeout(total=10)
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


class ProviderError(Exception):
    """The provider could not be reached or answered something unusable."""


class InvalidToken(Exception):
    """A token that does not prove who someone is: the message says what is wrong with it."""


class Refused(Exception):
    """The provider refused a grant (RFC 6749 `error`): revoked, expired, denied."""

    def __init__(self, error: str, description: str) -> None:
        super().__init__(f"{error}: {description}" if description else error)
        self.error = error


@dataclass(frozen=True, slots=True)
class Tokens:
    """What a token request gave: the ID token's verified claims, the refresh token (if any)
    and until when the provider vouches for the person without another check."""

    claims: dict[str, Any]
    refresh_token: str | None = field(repr=False)
    expires_at: datetime


def pkce_pair() -> tuple[str, str]:
    """A PKCE verifier and its S256 challenge (RFC 7636)."""
    verifier = secrets.token_urlsafe(48)
    return verifier, s256(verifier)


class OidcProvider:
    def __init__(
        self,
        config: IdentityConfig,
        http: aiohttp.ClientSession,
        *,
        refetch_s: float = REFETCH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._http = http
        self._refetch_s = refetch_s
        self._clock = clock
        self._metadata: dict[str, Any] | None = None
        self._keys: KeySet | None = None
        self._fetched_at = -float("inf")
        self._lock = asyncio.Lock()
        self.jwks_fetches = 0
        """How many times the JWKS was fetched (the rate limit's effect, for operators and
        tests)."""

    async def metadata(self) -> dict[str, Any]:
        """The discovery document (fetched once; its endpoints do not move)."""
        if self._metadata is None:
            url = self.config.issuer.rstrip("/") + "/.well-known/openid-configuration"
            found = await self._get(url)
            if found.get("issuer") != self.config.issuer:
                raise ProviderError(
                    f"the discovery document names the issuer {found.get('issuer')!r}, "
                    f"not {self.config.issuer!r} (TRAINYARD_OIDC_ISSUER)"
                )
            self._metadata = found
        return self._metadata

    async def supports_device_flow(self) -> bool:
        return "device_authorization_endpoint" in await self.metadata()

    async def authorization_url(
        self, redirect_uri: str, state: str, nonce: str, challenge: str
    ) -> str:
        endpoint = await self._endpoint("authorization_endpoint")
        query = {
            "response_type": "code",
            "client_id": self.config.client_id,
            "redirect_uri": redirect_uri,
            "scope": self._scope(),
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            # A refresh token needs the person's consent to offline access (OIDC Core 11).
            "prompt": "consent",
        }
        return f"{endpoint}?{urlencode(query)}"

    async def exchange_code(
        self, code: str, verifier: str, redirect_uri: str, nonce: str
    ) -> Tokens:
        answer = await self._token(
            {
                "grant_type": "authorization_code",
                "code": code,
                "code_verifier": verifier,
                "redirect_uri": redirect_uri,
            }
        )
        return await self._tokens(answer, nonce)

    async def device_authorization(self) -> dict[str, Any]:
        """RFC 8628 §3.1: the codes the person enters at the provider and the CLI polls with."""
        endpoint = await self._endpoint("device_authorization_endpoint")
        return await self._post(endpoint, {"scope": self._scope()})

    async def device_token(self, device_code: str) -> Tokens:
        """RFC 8628 §3.4; Refused("authorization_pending" or "slow_down") while the person has
        not yet approved."""
        answer = await self._token({"grant_type": DEVICE_GRANT, "device_code": device_code})
        return await self._tokens(answer, None)

    async def refresh(self, refresh_token: str) -> Tokens:
        """Use the refresh token: the provider's word that the person's grant still stands."""
        answer = await self._token({"grant_type": "refresh_token", "refresh_token": refresh_token})
        tokens = await self._tokens(answer, None, id_required=False)
        if tokens.refresh_token is None:  # not rotated: the same one stays good
            return Tokens(tokens.claims, refresh_token, tokens.expires_at)
        return tokens

    async def revoke(self, refresh_token: str) -> bool:
        """Revoke the refresh token at the provider (RFC 7009), so that a copy of it grants
        nothing more; False when the provider publishes no revocation endpoint."""
        endpoint = (await self.metadata()).get("revocation_endpoint")
        if not isinstance(endpoint, str):
            return False
        form = {"token": refresh_token, "token_type_hint": "refresh_token"}
        try:
            async with self._http.post(
                endpoint, data=form, headers=self._client_auth(), timeout=TIMEOUT
            ) as response:
                # RFC 7009 2.2: 200 also for a token already invalid; the body is empty.
                if response.status != 200:
                    raise ProviderError(f"{endpoint} answered {response.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProviderError(
                f"the identity provider cannot be reached ({endpoint}: {exc})"
            ) from exc
        return True

    async def verify(self, token: str, nonce: str | None = None) -> dict[str, Any]:
        """The claims of an ID token the provider signed for this client and that has not
        expired; InvalidToken saying what is wrong otherwise."""
        try:
            header = jws.extract_compact(token.encode()).protected
        except (JoseError, ValueError, UnicodeError) as exc:
            raise InvalidToken("not a signed JWT") from exc
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in ALGORITHMS:
            raise InvalidToken(f"signed with {alg!r}, which is not accepted")
        keys = await self._keys_for(kid if isinstance(kid, str) else None)
        try:
            decoded = jwt.decode(token, keys, algorithms=ALGORITHMS)
        except (JoseError, ValueError) as exc:
            raise InvalidToken(f"bad signature ({exc})") from exc
        claims = dict(decoded.claims)
        checks: dict[str, Any] = {
            "iss": {"essential": True, "value": self.config.issuer},
            "aud": {"essential": True, "value": self.config.client_id},
            "exp": {"essential": True},
            "sub": {"essential": True},
        }
        if nonce is not None:
            checks["nonce"] = {"essential": True, "value": nonce}
        try:
            jwt.JWTClaimsRegistry(leeway=LEEWAY_S, **checks).validate(claims)
        except JoseError as exc:
            raise InvalidToken(f"{exc.error}: {exc.description}") from exc
        return claims

    async def _keys_for(self, kid: str | None) -> KeySet:
        """The published keys, holding `kid` if the provider publishes it now: fetched again
        for an unknown one, at most once per `refetch_s`."""
        async with self._lock:
            if self._keys is None or (
                kid is not None
                and not _holds(self._keys, kid)
                and self._clock() - self._fetched_at >= self._refetch_s
            ):
                jwks_uri = await self._endpoint("jwks_uri")
                self._fetched_at = self._clock()
                self.jwks_fetches += 1
                try:
                    self._keys = KeySet.import_key_set(await self._get(jwks_uri))  # type: ignore[arg-type]
                except (JoseError, ValueError, TypeError) as exc:
                    raise ProviderError(f"the provider's JWKS is unusable: {exc}") from exc
            keys = self._keys
        if kid is not None and not _holds(keys, kid):
            raise InvalidToken(f"signed with key {kid!r}, which the provider does not publish")
        return keys

    def _scope(self) -> str:
        return "openid email groups offline_access"

    async def _endpoint(self, name: str) -> str:
        value = (await self.metadata()).get(name)
        if not isinstance(value, str):
            raise ProviderError(f"the provider's discovery document has no {name}")
        return value

    async def _token(self, form: dict[str, str]) -> dict[str, Any]:
        return await self._post(await self._endpoint("token_endpoint"), form)

    async def _tokens(
        self, answer: dict[str, Any], nonce: str | None, *, id_required: bool = True
    ) -> Tokens:
        """The verified claims ({} for a refresh that brought no ID token: the session keeps
        what it had), the refresh token and the expiry."""
        id_token = answer.get("id_token")
        claims: dict[str, Any] = {}
        if isinstance(id_token, str):
            claims = await self.verify(id_token, nonce)
        elif id_required:
            raise ProviderError("the provider's token response has no id_token")
        refresh = answer.get("refresh_token")
        lifetime = answer.get("expires_in")
        now = datetime.now(UTC)
        # Until the access token the provider issued with it expires, else the ID token.
        if isinstance(lifetime, int | float) and lifetime > 0:
            expires_at = now + timedelta(seconds=float(lifetime))
        elif claims:
            expires_at = datetime.fromtimestamp(float(claims["exp"]), UTC)
        else:
            raise ProviderError("the provider's token response says no expiry")
        return Tokens(claims, refresh if isinstance(refresh, str) else None, expires_at)

    async def _get(self, url: str) -> dict[str, Any]:
        try:
            async with self._http.get(url, timeout=TIMEOUT) as response:
                if response.status != 200:
                    raise ProviderError(f"{url} answered {response.status}")
                return _object(await response.read(), url)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProviderError(f"the identity provider cannot be reached ({url}: {exc})") from exc

    def _client_auth(self) -> dict[str, str]:
        # client_secret_basic (RFC 6749 2.3.1): each part form-encoded first.
        auth = aiohttp.encode_basic_auth(
            quote(self.config.client_id), quote(self.config.client_secret)
        )
        return {"Authorization": auth}

    async def _post(self, url: str, form: dict[str, str]) -> dict[str, Any]:
        try:
            async with self._http.post(
                url, data=form, headers=self._client_auth(), timeout=TIMEOUT
            ) as response:
                body = _object(await response.read(), url)
                if response.status == 200:
                    return body
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProviderError(f"the identity provider cannot be reached ({url}: {exc})") from exc
        error = body.get("error")
        if response.status in (400, 401) and isinstance(error, str):
            description = body.get("error_description")
            raise Refused(error, description if isinstance(description, str) else "")
        raise ProviderError(f"{url} answered {response.status}")


def _holds(keys: KeySet, kid: str) -> bool:
    return any(key.kid == kid for key in keys.keys)


def _object(raw: bytes, url: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ProviderError(f"{url} did not answer JSON") from exc
    if not isinstance(value, dict):
        raise ProviderError(f"{url} did not answer a JSON object")
    return value
