"""The operator's settings and the mapping from the provider's groups to a principal (pure: no
provider, no database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.identity.config import ConfigError, IdentityConfig
from controlplane.identity.mapping import (
    GroupMapping,
    Unmapped,
    groups_of,
    parse_admin_groups,
    parse_tenant_groups,
    principal_for,
)
from controlplane.tenants.principals import Principal

MAPPING = GroupMapping(
    parse_tenant_groups("ml-acme=acme, ml-globex = globex"), parse_admin_groups("ops,")
)


def test_admin_groups_win_then_the_first_mapped_group_in_the_operators_order() -> None:
    assert principal_for(MAPPING, "a", ["ml-globex", "ops"]) == Principal(None, True)
    # In both mapped groups: the first pair the operator listed, whatever the token's order.
    assert principal_for(MAPPING, "a", ["ml-globex", "ml-acme"]) == Principal("acme", False)
    assert principal_for(MAPPING, "a", ["x", "ml-globex"]) == Principal("globex", False)


def test_a_person_in_no_mapped_group_is_told_which_groups_the_provider_gave() -> None:
    refused = principal_for(MAPPING, "mallory@example.test", ["interns", "all"])
    assert isinstance(refused, Unmapped)
    assert refused.message.startswith("mallory@example.test is in no group that Trainyard maps")
    assert "(the provider gave these groups: all, interns)" in refused.message
    none = principal_for(MAPPING, "x", [])
    assert isinstance(none, Unmapped) and "groups: none" in none.message


def test_the_groups_claim_is_read_defensively() -> None:
    assert groups_of({"groups": ["a", 3, "b"]}, "groups") == ("a", "b")
    assert groups_of({"groups": "a"}, "groups") == ("a",)
    assert groups_of({"groups": {"a": 1}}, "groups") == ()
    assert groups_of({}, "groups") == ()


@pytest.mark.parametrize("text", ["acme", "=acme", "g=", "g=Acme", "g=acme corp", "g=-x"])
def test_a_mapping_that_is_not_group_equals_tenant_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not GROUP=TENANT"):
        parse_tenant_groups(text)


def test_settings(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    assert IdentityConfig.from_env({}) is None
    env = {
        "TRAINYARD_OIDC_ISSUER": "https://sso.example.org/realm/",
        "TRAINYARD_OIDC_CLIENT_ID": "trainyard",
        "TRAINYARD_OIDC_CLIENT_SECRET_FILE": str(secret),
        "TRAINYARD_OIDC_TENANT_GROUPS": "g=acme",
    }
    config = IdentityConfig.from_env(env)
    assert config is not None
    assert config.issuer == "https://sso.example.org/realm/"  # as the tokens name it
    assert config.client_secret == "s3cret" and "s3cret" not in repr(config)
    assert config.mapping.tenant_groups == (("g", "acme"),)
    assert config.name == "your identity provider" and config.check_interval_s == 300
    wrong = {
        "TRAINYARD_OIDC_ISSUER": ("sso.example.org", "must be the provider's https:// URL"),
        "TRAINYARD_OIDC_CLIENT_ID": ("", "TRAINYARD_OIDC_CLIENT_ID is needed"),
        "TRAINYARD_OIDC_CLIENT_SECRET_FILE": (str(tmp_path / "nope"), "cannot read the client"),
        "TRAINYARD_OIDC_TENANT_GROUPS": ("g:acme", "is not GROUP=TENANT"),
        "TRAINYARD_OIDC_CHECK_INTERVAL_S": ("soon", "seconds from 0 to 86400"),
    }
    for name, (value, why) in wrong.items():
        with pytest.raises(ConfigError, match=why):
            IdentityConfig.from_env({**env, name: value})
