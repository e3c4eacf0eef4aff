"""The searches facade without HTTP, on a real Postgres: what it refuses before anything is
written (an image not allowed, more trials at once than the tenant may queue jobs, a reason
Postgres cannot store), and a search another tenant cannot find."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from aiohttp.resolver import ThreadedResolver

from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.application import JobsApplication
from controlplane.jobs.images import ImageAllowlist
from controlplane.jobs.locations import Roots
from controlplane.queries import Q
from controlplane.refusals import Refusal, Refused
from controlplane.searches.application import SearchesApplication
from controlplane.searches.projection import SearchesProjection
from controlplane.searches.service import Searches, new_search_id
from controlplane.searches.spec import SearchSpec
from controlplane.tenants.principals import Principal
from controlplane.tenants.service import set_limits
from controlplane.tenants.submissions import SubmissionRates
from controlplane.webhooks.targets import CheckingResolver
from tests.cluster import Plane
from tests.controlplane.searches.test_search_service import spec

ACME = Principal(tenant="acme", is_admin=False)
GLOBEX = Principal(tenant="globex", is_admin=False)
USER = Metadata(actor="tenant:acme", tenant="acme")


@pytest.fixture
async def searches(plane: Plane, store: EventStore, pool: asyncpg.Pool) -> SearchesApplication:
    images = ImageAllowlist.parse("img")
    jobs = JobsApplication(
        plane.jobs,
        pool,
        store,
        images=images,
        roots=Roots(),
        submissions=SubmissionRates(),
        webhook_targets=CheckingResolver(ThreadedResolver(), ()),
    )
    return SearchesApplication(Searches(store, plane.jobs), jobs, pool, images=images)


async def test_a_search_the_rules_refuse_is_not_written(
    searches: SearchesApplication, plane: Plane, store: EventStore
) -> None:
    await set_limits(store, plane.runner, "acme", {"queued_jobs": 2}, actor="test")
    too_wide = SearchSpec.model_validate(spec(max_concurrent_trials=3))
    with pytest.raises(Refusal) as refused:
        await searches.submit("acme", too_wide, USER, "wide")
    assert (refused.value.kind, refused.value.field) == (Refused.INVALID, "max_concurrent_trials")
    assert "may queue jobs (2)" in refused.value.message
    elsewhere = SearchSpec.model_validate(spec(trial={**spec()["trial"], "image": "other"}))
    with pytest.raises(Refusal) as refused:
        await searches.submit("acme", elsewhere, USER, "elsewhere")
    assert (refused.value.kind, refused.value.field) == (Refused.INVALID, "trial.image")
    for key in ("wide", "elsewhere"):
        assert await searches.searches.load(new_search_id("acme", key)) is None


async def test_another_tenants_search_is_not_found_and_a_bad_reason_changes_nothing(
    searches: SearchesApplication,
) -> None:
    created, new = await searches.submit("acme", SearchSpec.model_validate(spec()), USER, "k")
    again, new_again = await searches.submit("acme", SearchSpec.model_validate(spec()), USER, "k")
    assert (new, new_again, again.id) == (True, False, created.id)
    for who, raw in ((GLOBEX, str(created.id)), (ACME, "not-a-search")):
        with pytest.raises(Refusal) as refused:
            await searches.loaded(who, raw)
        assert refused.value.kind is Refused.NOT_FOUND
    search = await searches.loaded(ACME, str(created.id))
    for reason, message in (("x" * 1001, "at most 1000"), ("a\0b", "without NUL")):
        with pytest.raises(Refusal) as refused:
            await searches.cancel(search, reason, USER)
        assert (refused.value.kind, refused.value.field) == (Refused.MALFORMED, "reason")
        assert message in refused.value.message
    assert (await searches.loaded(ACME, str(created.id))).state == "running"
    cancelled = await searches.cancel(search, "", USER)
    assert (cancelled.id, cancelled.state) == (created.id, "cancelled")
    with pytest.raises(Refusal) as refused:
        await searches.cancel(search, None, USER)
    assert refused.value.kind is Refused.CONFLICT


async def test_a_search_just_submitted_is_found_once_the_read_model_shows_it(
    searches: SearchesApplication, pool: asyncpg.Pool, plane: Plane
) -> None:
    # The read model held back, as another control plane applying it slowly would.
    async with pool.acquire() as holder:
        hold = holder.transaction()
        await hold.start()
        await holder.execute(Q["lock_projection_wait"], SearchesProjection.name)
        created, _ = await searches.submit("acme", SearchSpec.model_validate(spec()), USER, "new")
        found = asyncio.create_task(searches.visible(ACME, str(created.id)))
        await asyncio.sleep(0.3)
        assert not found.done()  # waiting for the read model, not "no such search"
        with pytest.raises(Refusal) as refused:
            await searches.visible(GLOBEX, str(created.id))  # another tenant's: at once
        assert refused.value.kind is Refused.NOT_FOUND
        await hold.rollback()
    # Applied now, whether or not news woke the runner after its try found the lock held.
    await plane.runner.catch_up(plane.runner.projections[SearchesProjection.name])
    row = await asyncio.wait_for(found, 5)
    assert (row["search_id"], row["tenant"]) == (created.id, "acme")


async def test_a_search_is_carried_out_as_stored_so_its_driver_makes_the_same_trial_jobs(
    searches: SearchesApplication,
) -> None:
    # Postgres writes this float back as an integer: trial jobs made from the search as
    # submitted and from it as stored (the driver's) would be two manifests under one job id.
    space = {"params": {"x": {"type": "choice", "values": [9.325960255098408e65, 1.5]}}}
    carried, created = await searches.searches.submit(
        "acme", SearchSpec.model_validate(spec(space=space)), USER, "big"
    )
    assert created
    assert carried == await searches.searches.load(carried.search_id)
