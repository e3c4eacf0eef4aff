"""What the dashboard's sign-in answers: a session opened, who a session (or a token) is, and
the identity provider the sign-in page offers."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.instants import Instant

CSRF = (
    "send it as X-CSRF-Token with every request that changes something (null when "
    "authenticated by a bearer token)"
)


class DashboardSession(BaseModel):
    """A session just opened; its cookie comes in Set-Cookie, out of any script's reach."""

    csrf: str = Field(description=CSRF)
    expires_at: Instant


class WhoAmI(BaseModel):
    tenant: str | None = Field(description="null for the admin")
    is_admin: bool
    csrf: str | None = Field(description=CSRF)
    expires_at: Instant | None = Field(
        description="when the session ends (null when authenticated by a bearer token)"
    )


class SignInProvider(BaseModel):
    name: str = Field(description='what the sign-in button says: "Sign in with NAME"')
    url: str = Field(description="where the sign-in through it starts")


class SignInProviders(BaseModel):
    oidc: SignInProvider | None = Field(
        description="the identity provider (null: the operator configured none; tokens only)"
    )
