"""The tenants' facade: what it refuses it says as a Refusal of the right kind and writes
nothing; a change names only what it changes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from controlplane.clock import SYSTEM_CLOCK
from controlplane.refusals import Refusal, Refused
from controlplane.tenants.application import TenantsApplication
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.requests import TenantCreate, TenantUpdate, TokenRequest
from tests.cluster import Plane
from tests.tenancy import event_count


@pytest.fixture
def tenants(plane: Plane) -> TenantsApplication:
    return TenantsApplication(plane.pool, plane.store, plane.runner, SYSTEM_CLOCK)


async def test_refusals_say_their_kind_and_write_nothing(
    tenants: TenantsApplication, owner: asyncpg.Connection
) -> None:
    refused: list[tuple[Callable[[], Awaitable[object]], Refused]] = [
        (lambda: tenants.update("acme", TenantUpdate()), Refused.INVALID),
        (lambda: tenants.set_limits("acme", TenantLimits()), Refused.INVALID),
        (lambda: tenants.update("ghost", TenantUpdate(weight=2)), Refused.NOT_FOUND),
        # A name no tenant could have is not looked up (Postgres refuses a NUL: a 500 else).
        (lambda: tenants.get("ac\0me"), Refused.NOT_FOUND),
        (lambda: tenants.issue_token("Acme", TokenRequest()), Refused.NOT_FOUND),
        (lambda: tenants.revoke_token("acme", "tok_none"), Refused.NOT_FOUND),
        (lambda: tenants.create(TenantCreate(name="acme")), Refused.CONFLICT),
    ]
    before = await event_count(owner)
    for call, kind in refused:
        with pytest.raises(Refusal) as caught:
            await call()
        assert caught.value.kind is kind, caught.value.message
    assert await event_count(owner) == before


async def test_limits_left_out_stay_and_a_rotation_leaves_one_token(
    tenants: TenantsApplication,
) -> None:
    created = await tenants.create(TenantCreate(name="initech", gpu_quota=2))
    assert created.tenant.active_tokens == [created.token_id]
    assert created.tenant.limits == TenantLimits()

    limits = await tenants.set_limits("initech", TenantLimits(streams=3))
    assert limits == TenantLimits().model_copy(update={"streams": 3})
    # A null quota removes it; the weight, left out, stays.
    updated = await tenants.update("initech", TenantUpdate(gpu_quota=None))
    assert (updated.weight, updated.gpu_quota, updated.limits) == (1.0, None, limits)

    issued = await tenants.issue_token("initech", TokenRequest(revoke_others=True))
    assert (await tenants.get("initech")).active_tokens == [issued.token_id]
