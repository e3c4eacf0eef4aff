"""The views of a tenant's webhook signing secrets its readers get."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.instants import Instant
from controlplane.webhooks.tenant_secrets import IssuedSecret, SigningSecret


class SecretView(BaseModel):
    id: str
    secret: str
    created_at: Instant
    valid_until: Instant | None = Field(
        description="null for the current secret; for a replaced one, the end of its grace period"
    )

    @classmethod
    def of(cls, secret: SigningSecret) -> SecretView:
        return cls(
            id=secret.secret_id,
            secret=secret.secret,
            created_at=secret.created_at,
            valid_until=secret.valid_until,
        )


class SigningSecrets(BaseModel):
    tenant: str
    secrets: list[SecretView] = Field(
        description="the secrets deliveries are signed with now, the current one first"
    )


class IssuedSecretView(BaseModel):
    tenant: str
    id: str
    secret: str
    created_at: Instant
    previous_valid_until: Instant | None = Field(
        description="until when the replaced secret signs deliveries too"
    )

    @classmethod
    def of(cls, issued: IssuedSecret) -> IssuedSecretView:
        return cls(
            tenant=issued.tenant,
            id=issued.secret_id,
            secret=issued.secret,
            created_at=issued.created_at,
            previous_valid_until=issued.previous_valid_until,
        )
