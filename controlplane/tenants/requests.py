"""What the admin asks of tenants: create one, change its settings, issue it a token."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from controlplane.tenants.validation import NAME

INT4_MAX = 2**31 - 1
"""A quota is stored as int4."""


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=f"^{NAME.pattern}$", description="lowercase letters, digits, '-'")
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="cluster share")
    gpu_quota: int | None = Field(
        default=None, ge=0, le=INT4_MAX, description="most GPUs held at once"
    )


class TenantUpdate(BaseModel):
    """The settings to change; a `gpu_quota` of null removes the quota."""

    # An empty body changes nothing, and `update` refuses it: the schema says so.
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    weight: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    gpu_quota: int | None = Field(default=None, ge=0, le=INT4_MAX)


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    revoke_others: bool = Field(default=False, description="revoke every other token (rotation)")
