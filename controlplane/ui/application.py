"""The dashboard's sign-in as its page uses it: a bearer token traded for a session, who a
session is, signing out, and the identity provider the sign-in page offers (whose own flows are
`controlplane.identity.application`'s).

A facade in the sense of eventsourcing's Application: the HTTP layer routes and authenticates,
sets and clears the cookies; this decides and answers with the views (`ui.views`).
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from controlplane.identity.application import SignIn
from controlplane.identity.service import SignInRefused
from controlplane.refusals import Refusal, Refused
from controlplane.tenants.principals import Principal
from controlplane.ui.sessions import Session, end_session, open_session
from controlplane.ui.views import DashboardSession, SignInProvider, SignInProviders, WhoAmI


@dataclass(frozen=True, slots=True)
class NewSession:
    cookie: str
    """The session cookie's value: the browser's alone, never in a body a script reads."""
    view: DashboardSession


class Dashboard:
    def __init__(self, pool: asyncpg.Pool, sign_in: SignIn | None) -> None:
        """`sign_in`: the identity provider's sign-in, when the operator configured one."""
        self._pool = pool
        self._sign_in = sign_in

    def signing_in(self) -> SignIn:
        """The sign-in through the identity provider; refused when none is configured."""
        if self._sign_in is None:
            raise Refusal(
                Refused.NOT_FOUND, "no identity provider is configured: sign in with a token"
            )
        return self._sign_in

    async def sign_in(self, token: str) -> NewSession:
        """A session for a live bearer token."""
        opened = await open_session(self._pool, token)
        if opened is None:
            raise SignInRefused(401, "invalid or revoked token", field="token")
        return NewSession(
            opened.cookie, DashboardSession(csrf=opened.csrf, expires_at=opened.expires_at)
        )

    @staticmethod
    def whoami(who: Principal, session: Session | None) -> WhoAmI:
        """Who is signed in, and the session's CSRF token (`session`: the dashboard session the
        request came with, None for a bearer token)."""
        return WhoAmI(
            tenant=who.tenant,
            is_admin=who.is_admin,
            csrf=None if session is None else session.csrf,
            expires_at=None if session is None else session.expires_at,
        )

    async def sign_out(self, cookie: str | None) -> None:
        """End the session whose cookie the browser sent, whichever sign-in opened it: it stops
        working at once, also where it was copied."""
        if cookie is None:
            return
        await end_session(self._pool, cookie)
        if self._sign_in is not None:
            await self._sign_in.identity.end(cookie, "signed out")

    def providers(self) -> SignInProviders:
        """The identity provider the sign-in page offers, if any."""
        if self._sign_in is None:
            return SignInProviders(oidc=None)
        return SignInProviders(
            oidc=SignInProvider(name=self._sign_in.name, url=self._sign_in.start)
        )
