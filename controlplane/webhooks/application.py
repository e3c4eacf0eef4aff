"""A tenant's webhook signing secrets as its front ends use them: read, and rotated.

A facade in the sense of eventsourcing's Application (see `controlplane.jobs.application`): it
takes the tenant a request acts for (the front end has authenticated it), and answers with the
views of `webhooks.views`; what it refuses it raises as a `Refusal`.
"""

from __future__ import annotations

import asyncpg

from controlplane.clock import Clock
from controlplane.events.store import EventStore
from controlplane.invariants import InvariantBroken
from controlplane.refusals import Refusal, Refused
from controlplane.tenants.errors import InvalidTenant, TenantBusy, UnknownTenant
from controlplane.webhooks.tenant_secrets import rotate, signing_secrets
from controlplane.webhooks.views import IssuedSecretView, SecretView, SigningSecrets


class WebhookSecretsApplication:
    def __init__(self, pool: asyncpg.Pool, store: EventStore, clock: Clock) -> None:
        self._pool = pool
        self._store = store
        self._clock = clock

    async def secrets(self, tenant: str) -> SigningSecrets:
        """The secrets deliveries are signed with now, the current one first (a tenant's token
        already holds every right over its jobs, so it may read what signs their
        notifications)."""
        secrets = await signing_secrets(self._pool, tenant)
        if not secrets:
            raise Refusal(
                Refused.NOT_FOUND,
                f"tenant {tenant!r} has no webhook secret yet: POST /v1/webhook-secret issues one "
                "(the first delivery also does)",
            )
        return SigningSecrets(tenant=tenant, secrets=[SecretView.of(s) for s in secrets])

    async def rotate(self, tenant: str, *, actor: str) -> IssuedSecretView:
        """Issue a new secret; the one it replaces keeps signing deliveries for a grace
        period."""
        try:
            issued = await rotate(self._pool, self._store, tenant, actor=actor, clock=self._clock)
        except (UnknownTenant, InvalidTenant) as exc:
            # A name no tenant could have (an admin's ?tenant=) names no tenant either.
            raise Refusal(Refused.NOT_FOUND, str(exc), field="tenant") from exc
        except TenantBusy as exc:
            raise Refusal(Refused.CONFLICT, str(exc)) from exc
        if issued is None:  # only `unless_present` rotations may issue nothing
            raise InvariantBroken(f"tenant {tenant}: a rotation issued no secret")
        return IssuedSecretView.of(issued)
