"""The tenants as the admin manages them: create, list, read, change weight, GPU quota and
limits, issue and revoke tokens.

A facade in the sense of eventsourcing's Application (see `controlplane.jobs.application`): it
takes requests already parsed and authenticated as the admin's, runs them through the tenants'
service, and answers with the views the admin gets (`tenants.views`). What it refuses it raises
as a `Refusal`; nothing is written then.
"""

from __future__ import annotations

import asyncpg

from controlplane.clock import Clock
from controlplane.events.store import EventStore
from controlplane.projections.runner import ProjectionRunner
from controlplane.refusals import Refusal, Refused
from controlplane.tenants.errors import (
    InvalidTenant,
    TenantBusy,
    TenantError,
    TenantExists,
    UnknownTenant,
    UnknownToken,
)
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.requests import TenantCreate, TenantUpdate, TokenRequest
from controlplane.tenants.service import (
    KEEP,
    create_tenant,
    issue_token,
    list_tenants,
    revoke_token,
    set_limits,
    update_tenant,
)
from controlplane.tenants.validation import NAME
from controlplane.tenants.views import CreatedTenant, IssuedTokenView, TenantList, TenantView

ACTOR = "admin"
"""Who the tenants' events name: only the admin manages tenants."""

_KINDS: dict[type[TenantError], Refused] = {
    InvalidTenant: Refused.INVALID,
    TenantExists: Refused.CONFLICT,
    TenantBusy: Refused.CONFLICT,
    UnknownTenant: Refused.NOT_FOUND,
    UnknownToken: Refused.NOT_FOUND,
}


class TenantsApplication:
    def __init__(
        self, pool: asyncpg.Pool, store: EventStore, projections: ProjectionRunner, clock: Clock
    ) -> None:
        self._pool = pool
        self._store = store
        self._projections = projections
        self._clock = clock

    async def list(self) -> TenantList:
        return TenantList(tenants=[TenantView.of(t) for t in await list_tenants(self._pool)])

    async def get(self, name: str) -> TenantView:
        _check_name(name)
        found = await list_tenants(self._pool, name)
        if not found:
            raise _unknown(name)
        return TenantView.of(found[0])

    async def limits(self, name: str) -> TenantLimits:
        return (await self.get(name)).limits

    async def create(self, request: TenantCreate) -> CreatedTenant:
        """The tenant and its first token (whose text is never stored, so shown only here)."""
        try:
            token = await create_tenant(
                self._store,
                self._projections,
                request.name,
                request.weight,
                request.gpu_quota,
                actor=ACTOR,
                clock=self._clock,
            )
        except TenantError as exc:
            raise _refusal(exc) from exc
        return CreatedTenant(
            tenant=await self.get(request.name), token_id=token.token_id, token=token.plaintext
        )

    async def update(self, name: str, request: TenantUpdate) -> TenantView:
        """The settings the request names changed; a null weight keeps the weight, a null
        gpu_quota removes the quota."""
        if not request.model_fields_set:
            raise Refusal(Refused.INVALID, "nothing to change: give weight, gpu_quota or both")
        _check_name(name)
        try:
            await update_tenant(
                self._store,
                self._projections,
                name,
                weight=KEEP if request.weight is None else request.weight,
                gpu_quota=request.gpu_quota if "gpu_quota" in request.model_fields_set else KEEP,
                actor=ACTOR,
            )
        except TenantError as exc:
            raise _refusal(exc) from exc
        return await self.get(name)

    async def set_limits(self, name: str, request: TenantLimits) -> TenantLimits:
        """Set the limits the request names; those it leaves out stay as they are (their
        defaults in `request` are not changes)."""
        if not request.model_fields_set:
            raise Refusal(
                Refused.INVALID,
                f"no limit to change: give one or more of {', '.join(TenantLimits.model_fields)}",
            )
        _check_name(name)
        changes = request.model_dump(include=request.model_fields_set)
        try:
            await set_limits(self._store, self._projections, name, changes, actor=ACTOR)
        except TenantError as exc:
            raise _refusal(exc) from exc
        return await self.limits(name)

    async def issue_token(self, name: str, request: TokenRequest) -> IssuedTokenView:
        _check_name(name)
        try:
            token = await issue_token(
                self._store,
                self._projections,
                name,
                revoke_others=request.revoke_others,
                actor=ACTOR,
                clock=self._clock,
            )
        except TenantError as exc:
            raise _refusal(exc) from exc
        return IssuedTokenView(tenant=name, token_id=token.token_id, token=token.plaintext)

    async def revoke_token(self, name: str, token_id: str) -> None:
        """Revoke one token; it stops authenticating once this returns."""
        _check_name(name)
        try:
            await revoke_token(self._store, self._projections, name, token_id, actor=ACTOR)
        except TenantError as exc:
            raise _refusal(exc) from exc


def _check_name(name: str) -> None:
    """A name no tenant could have is not looked up: there is no such tenant."""
    if not NAME.fullmatch(name):
        raise _unknown(name)


def _unknown(name: str) -> Refusal:
    return Refusal(Refused.NOT_FOUND, f"no tenant named {name!r}")


def _refusal(exc: TenantError) -> Refusal:
    return Refusal(_KINDS[type(exc)], str(exc))
