"""The operator's OpenID Connect settings, from the environment (docs/sign-in.md)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.failures import CommandFailed
from controlplane.identity.mapping import GroupMapping, parse_admin_groups, parse_tenant_groups
from controlplane.secret_arguments import read_secret_file

ISSUER_ENV = "TRAINYARD_OIDC_ISSUER"
CLIENT_ID_ENV = "TRAINYARD_OIDC_CLIENT_ID"
CLIENT_SECRET_FILE_ENV = "TRAINYARD_OIDC_CLIENT_SECRET_FILE"
NAME_ENV = "TRAINYARD_OIDC_NAME"
GROUPS_CLAIM_ENV = "TRAINYARD_OIDC_GROUPS_CLAIM"
TENANT_GROUPS_ENV = "TRAINYARD_OIDC_TENANT_GROUPS"
ADMIN_GROUPS_ENV = "TRAINYARD_OIDC_ADMIN_GROUPS"
CHECK_INTERVAL_ENV = "TRAINYARD_OIDC_CHECK_INTERVAL_S"
PUBLIC_URL_ENV = "TRAINYARD_PUBLIC_URL"

CHECK_INTERVAL_S = 300.0
"""How often a session is checked with the provider (its refresh token used): a revocation at
the provider ends the session within this time."""


class ConfigError(CommandFailed):
    """A setting that is wrong: the control plane does not start with it (the command line
    prints the message, which names the setting, and exits with 1)."""


@dataclass(frozen=True, slots=True)
class IdentityConfig:
    issuer: str
    client_id: str
    client_secret: str
    name: str
    """What the sign-in button says: "Sign in with <name>"."""
    mapping: GroupMapping
    groups_claim: str = "groups"
    check_interval_s: float = CHECK_INTERVAL_S
    public_url: str | None = None
    """The control plane's address as browsers reach it (the redirect URI's base); None: the
    request's own scheme and host."""

    def __repr__(self) -> str:  # the secret stays out of logs and tracebacks
        return f"IdentityConfig(issuer={self.issuer!r}, client_id={self.client_id!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> IdentityConfig | None:
        """The provider the environment configures; None when it configures none (bearer
        tokens only). ConfigError names the setting that is wrong."""
        env = os.environ if env is None else env
        issuer = env.get(ISSUER_ENV, "").strip()
        if not issuer:
            return None
        if not issuer.startswith(("https://", "http://")):
            raise ConfigError(f"{ISSUER_ENV} must be the provider's https:// URL, not {issuer!r}")
        client_id = env.get(CLIENT_ID_ENV, "").strip()
        if not client_id:
            raise ConfigError(f"{ISSUER_ENV} is set: {CLIENT_ID_ENV} is needed too")
        secret_file = env.get(CLIENT_SECRET_FILE_ENV, "").strip()
        if not secret_file:
            raise ConfigError(f"{ISSUER_ENV} is set: {CLIENT_SECRET_FILE_ENV} is needed too")
        try:
            secret = read_secret_file(secret_file, "client secret")
            mapping = GroupMapping(
                parse_tenant_groups(env.get(TENANT_GROUPS_ENV, "")),
                parse_admin_groups(env.get(ADMIN_GROUPS_ENV, "")),
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        try:
            interval = float(env.get(CHECK_INTERVAL_ENV) or CHECK_INTERVAL_S)
        except ValueError:
            interval = math.nan  # refused below, with the others
        if not 0 < interval <= 86400:  # NaN compares false: refused too
            raise ConfigError(f"{CHECK_INTERVAL_ENV} must be seconds from 0 to 86400")
        public = env.get(PUBLIC_URL_ENV, "").strip().rstrip("/") or None
        return cls(
            issuer=issuer,  # exactly as the tokens name it: a trailing slash counts
            client_id=client_id,
            client_secret=secret,
            name=env.get(NAME_ENV, "").strip() or "your identity provider",
            mapping=mapping,
            groups_claim=env.get(GROUPS_CLAIM_ENV, "").strip() or "groups",
            check_interval_s=interval,
            public_url=public,
        )
