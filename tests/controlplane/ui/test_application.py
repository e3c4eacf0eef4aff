"""The dashboard's facade on a real Postgres, without HTTP: a live token opens a session that
is who the token is, until signed out; anything else opens none; without an identity provider
the page offers none and its flows are not there."""

from __future__ import annotations

import asyncpg
import pytest

from controlplane.identity.service import SignInRefused
from controlplane.refusals import Refusal, Refused
from controlplane.tenants.principals import Principal
from controlplane.ui.application import Dashboard
from controlplane.ui.sessions import session
from controlplane.ui.views import SignInProviders
from tests.tenancy import Tokens


async def test_a_token_session_is_who_the_token_is_until_signed_out(
    pool: asyncpg.Pool, tokens: Tokens
) -> None:
    dashboard = Dashboard(pool, None)
    opened = await dashboard.sign_in(tokens.acme)
    found = await session(pool, opened.cookie)
    assert found is not None and found.principal == Principal(tenant="acme", is_admin=False)
    me = dashboard.whoami(found.principal, found)
    assert (me.tenant, me.csrf, me.expires_at) == ("acme", opened.view.csrf, found.expires_at)
    # The cookie is the browser's alone: the answer a script reads holds the CSRF token only,
    # and its instant as the API has always written it.
    dumped = opened.view.model_dump(mode="json")
    assert set(dumped) == {"csrf", "expires_at"} and opened.cookie not in dumped.values()
    assert dumped["expires_at"] == opened.view.expires_at.isoformat()
    await dashboard.sign_out(opened.cookie)
    assert await session(pool, opened.cookie) is None
    # A bearer token's caller has no session: nothing to send back.
    bearer = dashboard.whoami(found.principal, None)
    assert (bearer.csrf, bearer.expires_at) == (None, None)


@pytest.mark.parametrize("token", ["ty_nope", "", "\udcff", "ty_\0"])
async def test_anything_but_a_live_token_opens_no_session(
    pool: asyncpg.Pool, tokens: Tokens, token: str
) -> None:
    with pytest.raises(SignInRefused) as refused:
        await Dashboard(pool, None).sign_in(token)
    assert (refused.value.status, refused.value.field) == (401, "token")
    assert await pool.fetchval("SELECT count(*) FROM ui_sessions") == 0


async def test_without_a_provider_the_page_offers_none_and_its_flows_are_not_there(
    pool: asyncpg.Pool,
) -> None:
    dashboard = Dashboard(pool, None)
    assert dashboard.providers() == SignInProviders(oidc=None)
    with pytest.raises(Refusal) as refused:
        dashboard.signing_in()
    assert refused.value.kind is Refused.NOT_FOUND
    await dashboard.sign_out(None)  # a bearer token's sign-out ends nothing, and fails not
