"""What the sign-in through the identity provider answers `trainyard login` with: the device
flow's codes, a pending poll, the bearer token of a sign-in session, and a sign-out."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.instants import Instant


class SsoToken(BaseModel):
    """A sign-in session `trainyard login` saves and sends as its bearer token."""

    token: str = Field(
        description="a bearer token (ty_sso_...) good while the provider vouches for the person"
    )
    tenant: str | None
    is_admin: bool
    expires_at: Instant


class DeviceAuthorization(BaseModel):
    """The provider's device authorization (RFC 8628 §3.2), as the CLI needs it."""

    device_code: str = Field(description="what the CLI polls POST /v1/login/device/token with")
    user_code: str = Field(description="what the person enters at verification_uri")
    verification_uri: str
    verification_uri_complete: str | None = Field(
        description="verification_uri with the user code in it (null: the provider gives none)"
    )
    interval: int = Field(description="the seconds to wait between polls")
    expires_in: int | None = Field(description="the seconds the codes are good for")


class DevicePending(BaseModel):
    pending: str = Field(
        description="the provider's word for why not yet: authorization_pending, or slow_down "
        "(poll less often)"
    )


class SsoSignOut(BaseModel):
    revoked_at_provider: bool = Field(
        description="whether the provider revoked its token too (false: it offers no "
        "revocation or could not be reached, and its token lapses at its expiry)"
    )
