"""From the provider's groups to a Trainyard principal (pure): the operator maps groups to
tenants and to the admin role; a person in no mapped group is refused."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.tenants.principals import Principal
from controlplane.tenants.validation import NAME


@dataclass(frozen=True, slots=True)
class GroupMapping:
    tenant_groups: tuple[tuple[str, str], ...]
    """(group, tenant) pairs in the operator's order: a person in several mapped groups acts as
    the first one's tenant."""
    admin_groups: frozenset[str]


@dataclass(frozen=True, slots=True)
class Unmapped:
    """Why a person may not sign in, in words for them."""

    message: str


def parse_tenant_groups(text: str) -> tuple[tuple[str, str], ...]:
    """`GROUP=TENANT,GROUP=TENANT` (TRAINYARD_OIDC_TENANT_GROUPS); ValueError naming the pair
    that is not one."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        group, sep, tenant = (side.strip() for side in item.partition("="))
        if not sep or not group or not NAME.fullmatch(tenant):
            raise ValueError(
                f"TRAINYARD_OIDC_TENANT_GROUPS: {item!r} is not GROUP=TENANT "
                "(a tenant's name: lowercase letters, digits and dashes)"
            )
        pairs.append((group, tenant))
    return tuple(pairs)


def parse_admin_groups(text: str) -> frozenset[str]:
    """`GROUP,GROUP` (TRAINYARD_OIDC_ADMIN_GROUPS)."""
    return frozenset(filter(None, (part.strip() for part in text.split(","))))


def groups_of(claims: dict[str, object], claim: str) -> tuple[str, ...]:
    """The groups a token's claims name: a list of strings (or one string), else none."""
    value = claims.get(claim)
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(g for g in value if isinstance(g, str))
    return ()


def principal_for(mapping: GroupMapping, who: str, groups: Sequence[str]) -> Principal | Unmapped:
    """The admin for a member of an admin group; else the tenant of the first mapped group the
    person is in; else Unmapped, saying which groups the provider gave."""
    if mapping.admin_groups.intersection(groups):
        return Principal(tenant=None, is_admin=True)
    for group, tenant in mapping.tenant_groups:
        if group in groups:
            return Principal(tenant=tenant, is_admin=False)
    named = ", ".join(sorted(groups)[:20]) or "none"
    return Unmapped(
        f"{who} is in no group that Trainyard maps to a tenant or to the admin role "
        f"(the provider gave these groups: {named}); ask the operator to map one of them"
    )
