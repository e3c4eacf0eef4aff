"""The sign-in through the identity provider as its front ends use it (docs/sign-in.md): the
dashboard's authorization code flow with PKCE, and `trainyard login`'s device flow or loopback
redirect.

A facade in the sense of eventsourcing's Application: it takes requests already parsed, checks
what the provider's answer brings back, runs the flows through `Identity` and answers with the
views (`identity.views`). What it refuses it raises as a `SignInRefused`: its statuses (401 for
a sign-in the provider or a credential refused, 502 for a provider that failed) are not among a
`Refusal`'s kinds, and a refused browser sign-in is a page, or a redirect to the waiting CLI.
"""

from __future__ import annotations

from pydantic import ValidationError

from controlplane.identity.service import (
    CLI_PREFIX,
    Ended,
    Identity,
    Loopback,
    Opened,
    SignInRefused,
    Started,
)
from controlplane.identity.views import DeviceAuthorization, DevicePending, SsoSignOut, SsoToken

MAX_STATE = 100
"""The longest `state` the provider brings back: ours are 43 characters."""
MAX_CODE = 2000
"""The longest authorization code passed on to the provider."""
MAX_BINDING = 100
"""The longest login cookie: ours are 43 characters."""
DEVICE_INTERVAL_S = 5
"""How long the CLI waits between polls when the provider does not say (RFC 8628 §3.2)."""


class SignIn:
    def __init__(self, identity: Identity, *, start: str, callback: str) -> None:
        """`start` and `callback`: the paths where a browser's sign-in starts and where the
        provider sends it back."""
        self.identity = identity
        self.start = start
        self._callback = callback

    @property
    def name(self) -> str:
        """What the sign-in button says: "Sign in with <name>"."""
        return self.identity.config.name

    def redirect_uri(self, origin: str) -> str:
        """Where the provider sends the browser back: under the public URL the operator set,
        else under `origin` (the scheme and host the browser reached us at)."""
        return (self.identity.config.public_url or origin) + self._callback

    async def start_browser(self, origin: str, cli: Loopback | None) -> Started:
        """A browser's sign-in on its way to the provider; `cli`, the `trainyard login --sso`
        waiting on a loopback address for its one-time code."""
        return await self.identity.start_browser(self.redirect_uri(origin), cli)

    async def finish_browser(
        self,
        origin: str,
        binding: str | None,
        *,
        code: str | None,
        state: str | None,
        error: str | None,
        error_description: str | None,
    ) -> Opened:
        """The provider's answer (its query) traded for a session, in the browser whose login
        cookie is `binding`: a dashboard session, or a one-time code for the waiting CLI
        (`Opened.loopback`)."""
        if error is not None:
            why = error_description or error
            raise SignInRefused(401, f"the identity provider did not sign you in: {why}")
        if not code or not state:
            raise SignInRefused(400, "the identity provider's answer lacks its code or state")
        if (
            not binding
            or len(binding) > MAX_BINDING
            or len(state) > MAX_STATE
            or len(code) > MAX_CODE
            # Stored text holds no NUL: a state with one is none of ours.
            or "\0" in state
        ):
            raise SignInRefused(
                400, "this sign-in was started in another browser or has expired: sign in again"
            )
        return await self.identity.finish_browser(binding, state, code, self.redirect_uri(origin))

    async def finish_loopback(self, code: str, verifier: str) -> SsoToken:
        """The CLI's bearer token for the one-time code the browser brought it, given the
        verifier of the challenge it started with; once."""
        opened = await self.identity.finish_loopback(code, verifier)
        if opened is None:
            raise SignInRefused(
                401,
                "this code is unknown, used, expired or not yours: sign in again",
                field="code",
            )
        return _token(opened)

    async def start_device(self) -> DeviceAuthorization:
        """The provider's device flow started: the code the person enters there, the one the
        CLI polls with."""
        answer = await self.identity.start_device()
        shown = {
            key: answer.get(key)
            for key in ("device_code", "user_code", "verification_uri", "verification_uri_complete")
        }
        shown["interval"] = answer.get("interval", DEVICE_INTERVAL_S)
        shown["expires_in"] = answer.get("expires_in")
        try:
            return DeviceAuthorization.model_validate(shown)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise SignInRefused(
                502,
                "the identity provider failed: its device authorization's "
                f"{first['loc'][0]} is not RFC 8628's ({first['msg']})",
            ) from exc

    async def finish_device(self, device_code: str) -> SsoToken | DevicePending:
        """The CLI's bearer token once the person approved at the provider; else why not yet."""
        try:
            opened = await self.identity.finish_device(device_code)
        except SignInRefused as refused:
            if refused.status < 500:  # the code's fault, not the provider's
                refused.field = "device_code"
            raise
        if isinstance(opened, str):
            return DevicePending(pending=opened)
        return _token(opened)

    async def end(self, bearer: str) -> SsoSignOut:
        """`trainyard logout`: end the sign-in session whose bearer token is `bearer`, and
        revoke its refresh token at the provider."""
        if not bearer.startswith(CLI_PREFIX):
            raise SignInRefused(
                400,
                "only a session of `trainyard login --sso` is ended here; an admin revokes an "
                "issued token",
                field="Authorization",
            )
        ended = await self.identity.end(bearer, "signed out")
        return SsoSignOut(revoked_at_provider=ended is Ended.REVOKED)


def _token(opened: Opened) -> SsoToken:
    return SsoToken(
        token=opened.credential,
        tenant=opened.principal.tenant,
        is_admin=opened.principal.is_admin,
        expires_at=opened.expires_at,
    )
