"""Errors of tenant commands; each says what was wrong and that nothing was written."""

from __future__ import annotations


class TenantError(Exception):
    """Base of the errors of tenant commands."""


class InvalidTenant(TenantError):
    """A tenant name, weight or quota that breaks the rules: a usage error."""


class TenantExists(TenantError):
    """A tenant of that name exists already."""


class UnknownTenant(TenantError):
    """No tenant of that name exists."""


class UnknownToken(TenantError):
    """The tenant has no active token of that id."""


class TenantBusy(TenantError):
    """The tenant kept changing under concurrent commands; the command gave up."""
