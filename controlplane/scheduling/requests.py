"""What the admin asks of scheduling: the claim policy from now on."""

from __future__ import annotations

from pydantic import Field, field_validator

from controlplane.scheduling.policy import PolicyFields


class PolicyRequest(PolicyFields):
    """A claim policy to switch to, and why (recorded with it)."""

    reason: str | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="why (recorded with the switch, and in audit.actions)",
    )

    @field_validator("reason")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        # Stored in an event's JSON and in Postgres text: no NUL, no lone surrogate.
        if value is not None and ("\0" in value or _unencodable(value)):
            raise ValueError("text must be valid Unicode without NUL characters")
        return value


def _unencodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
